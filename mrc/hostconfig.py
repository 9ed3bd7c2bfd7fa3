"""The host configuration file of `mrcd` (docs/deploy.md): what a real host (not a testbed namespace)
needs to start MRC. Pure Python: the model, its TOML loader and the plan `mrcd --check-config` prints;
`mrcd` (ctl/daemon.py) carries the plan out.

A file names this host (name, MRC address), its plane ports in plane order (interface name, PCI address
or MAC; the port's IPv6 address; a next hop behind switches; XDP mode; rate), the fabric (a topology file
of mrc's own, or explicit ``[[peer]]`` tables for fabrics mrc does not run: hosts back to back, or a Clos
of SRv6 switches with the peers' micro-SID paths written out), the engine's profile (EVs, CC, timers),
the metrics address and the control socket. Every problem is a `HostConfigError` that reads
``FILE:LINE: key: problem`` (mrc.topology's `FileError`): the file, the line of the key (of its table
when the key is missing), the dotted key (``plane[2].interface``, ``peer[0].plane[1].paths[2]``) and the
problem; errors inside a referenced topology file keep that file's own name and line.

The EV -> path table toward a peer (`ev_paths`) follows the controller's rule (ctl/controller.py
`Controller.add_peer`, docs/design.md §6): EV i is plane ``i mod planes`` and the ``(i div planes) mod
n``-th of that plane's n paths (by spine for a topology; in the order the file lists them for explicit
peers). Its entries are `mrc.topology.Path` objects, the type the controller's `Routes` and the path map
take. For explicit peers their node names (``hops``) are made up so that links are distinct per plane and
shared between peers where the paths share switches (see `explicit_path`).
"""

from __future__ import annotations

import difflib
import errno
import ipaddress
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path as FsPath
from typing import Any, Final, Literal, cast

from . import topology
from .topology import (
    MAX_HOSTS,
    MAX_PLANES,
    FileError,
    LinkParams,
    Topology,
    format_rate,
    key_line,
    key_lines,
    rate_problem,
)
from .topology import Path as TopoPath
from .transport import NsccConfig, QpAttr
from .units import parse_rate, parse_size
from .wire.consts import DEFAULT_PAYLOAD, MAX_PAYLOAD, MIN_PAYLOAD
from .wire.packet import LINK_OVERHEAD, payload_for_mtu

XdpMode = Literal["native", "generic", "auto"]
Shape = Literal["back-to-back", "clos"]
Cc = Literal["nscc", "none"]

XDP_MODES: Final[tuple[XdpMode, ...]] = ("native", "generic", "auto")
SHAPES: Final[tuple[Shape, ...]] = ("back-to-back", "clos")
CC_NAMES: Final[tuple[Cc, ...]] = ("nscc", "none")
DEFAULT_PATH: Final = "/etc/mrc/mrcd.toml"
DEFAULT_SOCKET: Final = "/run/mrc/mrcd.sock"
DEFAULT_METRICS: Final = "127.0.0.1:9470"
DEFAULT_EVS: Final = 64  # as mrcd --evs
MAX_EVS: Final = 1 << 14  # an EV profile's 14-bit index
#: the shortest prefix of a port's address: mrcd installs the address and with it an on-link route for
#: its prefix, which at /0 would be a default route through that port (an outside audit's find)
MIN_PORT_PREFIX: Final = 16
MAX_US: Final = 10_000_000  # reorder / probe / base RTT: at most 10 s, as mrcd's options
MAX_WINDOW: Final = 1 << 30
MIN_WINDOW: Final = 8192
MAX_SOCKET_PATH: Final = 107  # sun_path holds 108 bytes with the NUL
#: [[peer]] tables at most: as many peers as the largest topology gives a host (2,048 hosts)
MAX_PEERS: Final = MAX_HOSTS - 1
#: Paths toward all peers together, over all planes (a plane without paths counts one: its own), that one
#: host's configuration may hold: what loading it builds, what `describe` lists and what the controller
#: keeps as alternatives (docs/deploy.md, "Limits"). 2^18: 512 hosts on 64 leaves with 16 planes and 32
#: spines (258,160 paths) load in 2.3 s; a topology at every limit at once (2,048 hosts, 16 planes, 256
#: spines) would build 8.4 million paths (2 minutes, 4.3 GB) before mrcd could start.
MAX_PATHS: Final = 1 << 18
#: mrcd's delayed ACK on fast ports (QpAttr.ack_delay_ns; the engine's own default is 4 us; see
#: `mrcd_ack_delay_ns` for where it applies). ``MRC_ACK_DELAY_NS`` (ctl.daemon.qp_attr_overrides) sets
#: another value for side-by-side runs.
MRCD_ACK_DELAY_NS: Final = 50_000
IFNAMSIZ: Final = 15
USID_BITS: Final = 16

_NAME_RE: Final = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}\Z")
_PCI_RE: Final = re.compile(r"^(?:([0-9a-f]{4}):)?([0-9a-f]{2}):([0-1][0-9a-f])\.([0-7])\Z")
_MAC_RE: Final = re.compile(r"^[0-9a-f]{2}(?::[0-9a-f]{2}){5}\Z")

#: the keys of each table, in the order the schema (docs/deploy.md) lists them
_TOP: Final = ("host", "plane", "fabric", "peer", "engine", "metrics", "control")
_HOST: Final = ("name", "mrc_address", "mrc_prefix")
_PLANE: Final = ("index", "interface", "pci", "mac", "address", "gateway", "xdp", "rate")
_FABRIC: Final = ("shape", "topology", "host", "usid_block")
_PEER: Final = ("name", "mrc_address", "plane")
_PEER_PLANE: Final = ("address", "paths")
_ENGINE: Final = ("evs", "cc", "reorder_us", "probe_timeout_us", "ack_timeout", "base_rtt_us", "max_window",
                  "mtu")
_METRICS: Final = ("address",)
_CONTROL: Final = ("socket",)


class HostConfigError(FileError):
    """A bad host configuration: ``FILE:LINE: key: problem`` (a `ConfigError`, exit code 2)."""


# ------------------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class Plane:
    """One plane port of this host. Exactly one of `interface`, `pci`, `mac` selects the NIC port."""

    index: int
    address: ipaddress.IPv6Interface  # this port's address (outer source of its MRC packets) and prefix
    interface: str | None = None
    pci: str | None = None  # 0000:3b:00.0 (normalised: domain given, lower case)
    mac: str | None = None  # 02:00:00:00:01:01 (lower case)
    gateway: ipaddress.IPv6Address | None = None  # next hop behind switches (None: back to back)
    xdp: XdpMode = "auto"
    rate_bps: int | None = None  # None: the interface's own speed (mrcd reads it at start)
    #: the file's key of this plane's table (``plane[2]``: its position, which errors and lines name;
    #: the index may differ); "" for a plane built in code
    key: str = field(default="", compare=False)

    @property
    def selector_key(self) -> str:
        """The file's key of the selector (``plane[2].interface``); "" for a plane built in code."""
        if not self.key:
            return ""
        kind = "interface" if self.interface is not None else "pci" if self.pci is not None else "mac"
        return f"{self.key}.{kind}"

    @property
    def selector(self) -> str:
        """How the file names the port: ``interface eth1``, ``pci 0000:3b:00.0``, ``mac 02:...``."""
        if self.interface is not None:
            return f"interface {self.interface}"
        if self.pci is not None:
            return f"pci {self.pci}"
        return f"mac {self.mac}"


@dataclass(frozen=True)
class PathSpec:
    """One path of a peer's plane: the outer destination address (a micro-SID container, or the peer's
    plane address where the fabric routes plain IPv6) and the micro-SIDs it carries (empty: opaque)."""

    container: ipaddress.IPv6Address
    usids: tuple[int, ...] = ()


@dataclass(frozen=True)
class PeerPlane:
    """A peer's port on one plane: its address there and the paths toward it (in EV order)."""

    address: ipaddress.IPv6Address
    paths: tuple[PathSpec, ...] = ()


@dataclass(frozen=True)
class Peer:
    name: str  # the name in the fabric (a topology's host name, or the [[peer]] name)
    mrc_address: ipaddress.IPv6Address
    planes: tuple[PeerPlane, ...]


@dataclass(frozen=True)
class Engine:
    evs: int = DEFAULT_EVS
    cc: Cc = "nscc"
    reorder_us: int = 2000
    probe_timeout_us: int = 20000
    ack_timeout: int = 15  # exponent: 1.024 us x 2^15 = 33.6 ms (the testbed's, docs/daemon.md)
    base_rtt_us: int = 500
    max_window_bytes: int | None = None  # None: 1.5 x window_bdp of the ports (as on the testbed)
    # payload bytes per packet (a power of two, 256..8192); None: the largest the smallest port MTU
    # carries whole (`payload_for_mtu`), found by mrcd at start
    mtu: int | None = None


@dataclass(frozen=True)
class Fabric:
    shape: Shape
    usid_block: ipaddress.IPv6Network = topology.DEFAULT_USID_BLOCK
    topology_file: FsPath | None = None  # resolved (relative to the configuration file's directory)
    topology: Topology | None = None
    host: str | None = None  # this host's name in the topology


@dataclass(frozen=True)
class HostConfig:
    source: str
    name: str
    mrc_address: ipaddress.IPv6Address
    mrc_prefix: ipaddress.IPv6Network | None  # None: one /128 route per peer
    planes: tuple[Plane, ...]
    fabric: Fabric
    peers: tuple[Peer, ...]
    engine: Engine = field(default_factory=Engine)
    metrics: tuple[str, int] | None = None
    socket: FsPath = FsPath(DEFAULT_SOCKET)
    # the file's key -> line (`key_lines`), for the problems mrcd finds at start (a port's MTU)
    source_lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def fabric_host(self) -> str:
        """This host's name in the fabric: the `src` of its paths (the topology's name for it, or
        `name`)."""
        return self.fabric.host or self.name

    @cached_property
    def _peer_index(self) -> dict[str, Peer]:
        return {p.name: p for p in self.peers}

    def peer(self, name: str) -> Peer:
        try:
            return self._peer_index[name]
        except KeyError:
            shown = ", ".join(p.name for p in self.peers[:8]) + (", ..." if len(self.peers) > 8 else "")
            raise KeyError(f"no peer {name!r} (peers: {shown})") from None

    def peer_names(self) -> list[str]:
        return [p.name for p in self.peers]


# ------------------------------------------------------------------------------------------- the EV table


@dataclass(frozen=True)
class EvRoute:
    """EV `ev` toward a peer: its path (`path.plane`, `path.container`), the port it leaves by and the
    next hop whose MAC the path map's entry needs (the gateway, or back to back the peer's port)."""

    ev: int
    path: TopoPath
    port: Plane
    next_hop: ipaddress.IPv6Address


def _plane_node(plane: int, what: str) -> str:
    return f"p{plane}:{what}"


def explicit_path(cfg: HostConfig, peer: Peer, plane: int, n: int) -> TopoPath:
    """Path `n` of `peer`'s plane `plane` as an `mrc.topology.Path`. Its ``hops`` name made-up nodes:
    ``p<plane>:<uSID hex>`` per micro-SID (so two peers' paths through one switch share its links),
    ``p<plane>:<container>`` for an opaque container, ``p<plane>:fabric`` where the fabric routes the
    peer's plane address itself, ``p<plane>:link`` for the back-to-back wire. ``spine`` is the path's
    position in the plane's list (None for the single implicit path); ``path_address`` is the host's MRC
    address (explicit fabrics have no per-path source addresses)."""
    pp = peer.planes[plane]
    if pp.paths:
        spec = pp.paths[n]
        mid = ([_plane_node(plane, f"{u:04x}") for u in spec.usids] if spec.usids
               else [_plane_node(plane, str(spec.container))])
        spine: int | None = n
    else:
        spec = PathSpec(pp.address)
        mid = [_plane_node(plane, "link" if cfg.fabric.shape == "back-to-back" else "fabric")]
        spine = None
    return TopoPath(cfg.fabric_host, peer.name, plane, spine, (cfg.fabric_host, *mid, peer.name), spec.usids,
                    spec.container, cfg.mrc_address)


def _by_spine(topo: Topology, src: str, dst: str, plane: int) -> list[TopoPath]:
    return sorted(topo.paths(src, dst, plane=plane), key=lambda x: x.spine or 0)


def plane_paths(cfg: HostConfig, peer: str, plane: int) -> list[TopoPath]:
    """The paths toward `peer` on `plane`, in EV order (a topology's sorted by spine, as the
    controller sorts them)."""
    topo = cfg.fabric.topology
    if topo is not None:
        return _by_spine(topo, cfg.fabric_host, peer, plane)
    p = cfg.peer(peer)
    return [explicit_path(cfg, p, plane, n) for n in range(max(1, len(p.planes[plane].paths)))]


def ev_paths(cfg: HostConfig, peer: str) -> list[TopoPath]:
    """The EV -> path table toward `peer` (index = EV index): the list `Routes(peer, paths, list(paths))`
    and the host egress path map take. EV i is plane ``i mod planes``, path ``(i div planes) mod n`` of
    that plane's n paths: the controller's rule (ctl/controller.py `Controller.add_peer`)."""
    planes = len(cfg.planes)
    by_plane = [plane_paths(cfg, peer, p) for p in range(planes)]
    return [by_plane[i % planes][(i // planes) % len(by_plane[i % planes])] for i in range(cfg.engine.evs)]


def next_hop(cfg: HostConfig, peer: str, plane: int) -> ipaddress.IPv6Address:
    """Where plane `plane`'s packets toward `peer` go first: the plane's gateway, or back to back the
    peer's own port."""
    gw = cfg.planes[plane].gateway
    if gw is not None:
        return gw
    return cfg.peer(peer).planes[plane].address


def ev_table(cfg: HostConfig, peer: str) -> list[EvRoute]:
    """`ev_paths` with each EV's port and next hop: what one path-map entry is made of (the port's
    ifindex and MAC and the next hop's MAC are looked up by mrcd at start)."""
    return [EvRoute(i, p, cfg.planes[p.plane], next_hop(cfg, peer, p.plane))
            for i, p in enumerate(ev_paths(cfg, peer))]


# ------------------------------------------------------------------------------------------- engine objects


def payload_size(cfg: HostConfig, port_mtus: Mapping[str, int]) -> int:
    """The QPs' payload per packet on ports of these MTUs (interface name -> bytes): [engine] mtu, else
    the largest the smallest port carries whole. A HostConfigError when [engine] mtu does not fit in a
    port (its packets would be dropped at the port, or by a peer's of the same MTU) or when a port's MTU
    is too small for any payload. A path's MTU can still be smaller than its ports' (a switch at 1500
    behind jumbo-frame NICs): then [engine] mtu must say so."""
    need = cfg.engine.mtu
    for ifname, mtu in sorted(port_mtus.items(), key=lambda kv: kv[1]):
        if need is None:
            try:
                return payload_for_mtu(mtu)
            except ValueError as err:
                raise HostConfigError(cfg.source, "plane.interface", f"{ifname}: {err}") from None
        if need + LINK_OVERHEAD > mtu:
            raise HostConfigError(
                cfg.source, "engine.mtu",
                f"{need}-byte payloads need an MTU of at least {need + LINK_OVERHEAD} on every port "
                f"({LINK_OVERHEAD} bytes of headers with the SRv6 encapsulation); {ifname} has {mtu} "
                f"(at most {payload_for_mtu(mtu) if mtu >= MIN_PAYLOAD + LINK_OVERHEAD else 'none'} fits)",
                key_line(cfg.source_lines, "engine.mtu"))
        return need
    return need if need is not None else DEFAULT_PAYLOAD


def mrcd_ack_delay_ns(port_rates_bps: list[int | None] | list[int], payload: int) -> int:
    """mrcd's delayed ACK for ports of these rates (0 or None: not known, as a real NIC's before mrcd
    reads it: taken as fast): MRCD_ACK_DELAY_NS where two packets of `payload` bytes can arrive within
    it at the ports' total rate, else the engine's own (4 us).

    Why longer where the ports are fast: mrcd hands the engine a loop turn's datagrams at once, and a
    busy turn lasts tens of microseconds, so a 4 us delay expired in every turn: one SACK per turn,
    every 4-5 data packets at 10 Gbit/s, each costing both mrcds a system call through the fabric and
    the requester's SACK path; at 50 us the responder answers every few turns or every ack_coalesce
    packets. Measured side by side on the 10 Gbit/s testbed (docs/daemon.md, "Fewer SACKs"): CPU per
    data packet 0.89x, goodput 1.11x. The SACK's service time tells the requester the wait, so its RTT
    samples do not grow. Why not where they are slow: there packets arrive further apart than the delay,
    so it coalesces nothing and only makes each packet's SACK a loop wake-up of its own (the demo's
    uncompressed ring on 4 x 100 Mbit/s ran 2.29-2.41 s against 2.30-2.32 s at 4 us)."""
    rates = list(port_rates_bps)
    if not rates or any(not r for r in rates):
        return MRCD_ACK_DELAY_NS
    two_packets_ns = 2 * payload * 8 * 1_000_000_000 // sum(r or 0 for r in rates)
    return MRCD_ACK_DELAY_NS if two_packets_ns <= MRCD_ACK_DELAY_NS else QpAttr().ack_delay_ns


def qp_attr(cfg: HostConfig, payload: int = DEFAULT_PAYLOAD,
            port_rates_bps: list[int | None] | list[int] | None = None) -> QpAttr:
    """The QP attributes mrcd gives every QP (as `Daemon.qp_attr`, from the file's [engine]), with
    `payload` bytes per packet (`payload_size`) on ports of these rates (`mrcd_ack_delay_ns`; None: not
    known). No AckReq floor: mrcd's delayed ACK answers within a few loop turns (QpAttr.ack_req_floor)."""
    e = cfg.engine
    return QpAttr(timeout=e.ack_timeout, reorder_ns=e.reorder_us * 1000,
                  probe_timeout_ns=e.probe_timeout_us * 1000, mtu=payload, ack_req_floor=0,
                  ack_delay_ns=mrcd_ack_delay_ns(port_rates_bps or [], payload))


def window_bdp(planes: int, rate_bps: int, buffer_bytes: int, base_rtt_ns: int) -> int:
    """The BDP, in bytes, that NSCC's largest window is 1.5 times (`NsccConfig.for_path`) when no window
    is configured: `rate_bps` (all planes together) x the base RTT, at least a third of the plane queues'
    buffers together and at most all of them. The floor keeps slow links' windows as they were (at 100
    Mbit/s a 500 us base RTT is 25 KB, a third of four 128 KiB queues 170 KB: the queues ECN-mark but
    rarely drop); the cap keeps what a window may put in the fabric within its queues. Why the rate at
    all: at 10 Gbit/s the floor alone held a bulk WRITE at 2.9 Gbit/s with the window full and the CPUs
    idle a third of the time (docs/daemon.md, "Gigabit speeds")."""
    buffers = planes * buffer_bytes
    return max(buffers // 3, min(rate_bps * base_rtt_ns // 8_000_000_000, buffers))


def max_window(cfg: HostConfig, port_rates_bps: list[int] | None = None) -> int:
    """NSCC's largest window in bytes: [engine] max_window, else 1.5 x `window_bdp` for the ports' rates
    (bit/s, mrcd reads them at start; None: the buffer's third alone) and the link buffer (a topology's,
    else `LinkParams`'s default), as on the testbed."""
    if cfg.engine.max_window_bytes is not None:
        return cfg.engine.max_window_bytes
    topo = cfg.fabric.topology
    buf = topo.link.buffer_bytes if topo is not None else LinkParams().buffer_bytes
    rate = sum(port_rates_bps) if port_rates_bps else 0
    return window_bdp(len(cfg.planes), rate, buf, cfg.engine.base_rtt_us * 1000) * 3 // 2


def nscc_config(cfg: HostConfig, payload: int = DEFAULT_PAYLOAD,
                port_rates_bps: list[int] | None = None) -> NsccConfig | None:
    """The CC profile of mrcd's QPs (`payload` bytes per packet): NSCC for the base RTT and window
    (`max_window`: its max_cwnd), or None for ``cc = "none"``."""
    if cfg.engine.cc == "none":
        return None
    base = cfg.engine.base_rtt_us * 1000
    window = max_window(cfg, port_rates_bps)
    return replace(NsccConfig.for_path(base, window * 2 // 3, payload), max_cwnd=max(2 * payload, window))


def port_rates(cfg: HostConfig) -> list[int | None]:
    """Per plane the pacing rate in bit/s (None: the interface's own speed, read by mrcd)."""
    return [p.rate_bps for p in cfg.planes]


# ------------------------------------------------------------------------------------------- describe


def _ack_ms(exp: int) -> str:
    return f"{1.024 * 2 ** exp / 1000:.3g} ms"


def _spread(n: int, parts: int) -> str:
    """How n EVs fall on `parts` paths round-robin: ``8 EVs each`` or ``8-9 EVs each``."""
    lo, hi = n // parts, -(-n // parts)
    return f"{lo} EVs each" if lo == hi else f"{lo}-{hi} EVs each"


def host_port(host: str, port: int) -> str:
    """ADDRESS:PORT as a URL writes it: an IPv6 address in brackets ("[::1]:9471", not "::1:9471")."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def describe(cfg: HostConfig) -> list[str]:
    """What mrcd would install from `cfg`, one line each, changing nothing: `mrcd --check-config`'s
    output. Per plane the port, its address, next hop and XDP intent; the MRC device with its address,
    rule and routes; per peer the EV table per plane; the engine profile, metrics and control socket."""
    f = cfg.fabric
    if f.topology is not None:
        fabric = f"clos from topology {f.topology_file} (this host is {f.host!r} there)"
    else:
        fabric = f"{f.shape}, explicit peers"
    out = [f"config {cfg.source}: host {cfg.name}, MRC address {cfg.mrc_address}, {len(cfg.planes)} planes, "
           f"{len(cfg.peers)} peer{'s' if len(cfg.peers) != 1 else ''}, fabric {fabric}"]
    xdp_text = {"auto": "XDP auto (native where the driver has it, else generic)",
                "native": "XDP native (refuse to start without driver support)", "generic": "XDP generic"}
    for p in cfg.planes:
        hop = f"next hop {p.gateway}" if p.gateway is not None else "next hop: the peer's port (back to back)"
        rate = format_rate(p.rate_bps) if p.rate_bps is not None else "the interface's speed"
        out.append(f"plane {p.index}: {p.selector}: address {p.address}, {hop}; "
                   f"host_ingress {xdp_text[p.xdp]}; paced at {rate}")
    routes = (f"route {cfg.mrc_prefix}" if cfg.mrc_prefix is not None
              else "routes " + ", ".join(f"{p.mrc_address}/128" for p in cfg.peers))
    out.append(f"mrc0: host_egress (TC egress); local address {cfg.mrc_address}/128; rule: IPv6 UDP to "
               f"port 4791 -> the MRC table; {routes} dev mrc0 src {cfg.mrc_address} in the MRC table")
    planes = len(cfg.planes)
    for peer in cfg.peers:
        out.append(f"peer {peer.name}: MRC address {peer.mrc_address}, {cfg.engine.evs} EVs over {planes} "
                   "planes")
        for plane in range(planes):
            paths = plane_paths(cfg, peer.name, plane)
            evs = len(range(plane, cfg.engine.evs, planes))  # EV i is on plane i mod planes (`ev_paths`)
            shown = ", ".join(f"{x.container} ({'-'.join(x.hops[1:-1])})" for x in paths)
            n = len(paths)
            on = "1 path" if n == 1 else f"{n} paths ({_spread(evs, n)})"
            via = next_hop(cfg, peer.name, plane)
            out.append(f"  plane {plane} -> {peer.planes[plane].address} via {via}: {evs} EVs on {on}: "
                       f"{shown}")
    e = cfg.engine
    rates = port_rates(cfg)
    if e.max_window_bytes is not None or all(r is not None for r in rates):
        window = f"window {max_window(cfg, [r for r in rates if r is not None])} bytes"
    else:  # mrcd reads the interfaces' speeds at start
        window = f"window from the ports' speeds at start, at least {max_window(cfg)} bytes"
    cc = f"nscc (base RTT {e.base_rtt_us} us, {window})" if e.cc == "nscc" else "none"
    out.append(f"engine: {e.evs} EVs per peer; CC {cc}; ACK timeout 2^{e.ack_timeout} x 1.024 us = "
               f"{_ack_ms(e.ack_timeout)}; reorder tolerance {e.reorder_us} us; "
               f"probe timeout {e.probe_timeout_us} us")
    if cfg.metrics is None:
        out.append("metrics: off")
    else:
        host, port = cfg.metrics
        out.append(f"metrics: http://{host_port(host, port)}/metrics")
    out.append(f"control socket: {cfg.socket} (mode 0600, root only)")
    return out


# ------------------------------------------------------------------------------------------- loading


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _show_path(path: FsPath) -> str:
    """A path for a message: whole up to 200 characters, else its ends and its length; one with a control
    character (a newline, an escape sequence) as its repr, so that the message stays one line and the
    terminal is not driven by it."""
    text = str(path)
    if not text.isprintable():
        text = repr(text)
    return text if len(text) <= 200 else f"{text[:120]}...{text[-40:]} ({len(text.encode())} bytes)"


class _Doc:
    """The parsed document with its source and key lines: every check raises through `fail`."""

    def __init__(self, source: str, lines: Mapping[str, int]) -> None:
        self.source, self.lines = source, lines

    def fail(self, key: str, problem: str) -> HostConfigError:
        return HostConfigError(self.source, key, problem, key_line(self.lines, key))

    def table(self, key: str, value: Any, keys: tuple[str, ...]) -> Mapping[str, Any]:
        """`value` as a table whose keys are all in `keys` (an unknown one: the nearest known suggested)."""
        if not isinstance(value, Mapping):
            raise self.fail(key, f"must be a table, got {_show(value)}")
        for k in value:
            if k not in keys:
                raise self.fail(f"{key}.{k}" if key else k, unknown_key(k, keys))
        return value

    def array(self, key: str, value: Any) -> list[Mapping[str, Any]]:
        if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
            raise self.fail(key, f"must be an array of tables ([[{key.rsplit('.', 1)[-1]}]]), "
                                 f"got {_show(value)}")
        return value

    def string(self, key: str, value: Any, example: str) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string such as {example!r}, got {_show(value)}")
        return value

    def integer(self, key: str, value: Any, lo: int, hi: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer, got {_show(value)}")
        if not lo <= value <= hi:
            raise self.fail(key, f"must be {lo}..{hi}, got {value}")
        return value

    def choice(self, key: str, value: Any, options: tuple[str, ...]) -> str:
        text = self.string(key, value, options[0])
        if text not in options:
            raise self.fail(key, f"must be one of {', '.join(repr(o) for o in options)}, got {text!r}")
        return text

    def name(self, key: str, value: Any) -> str:
        text = self.string(key, value, "gpu1")
        if not _NAME_RE.match(text):
            raise self.fail(key, f"{text!r} must be 1..63 lowercase letters, digits, '.', '-', '_' "
                                 "(starting with a letter or digit)")
        return text

    def address(self, key: str, value: Any, *, link_local: bool = False) -> ipaddress.IPv6Address:
        """An IPv6 unicast address (link-local only where `link_local`: a next hop)."""
        text = self.string(key, value, "fd00:0:0:1::1")
        try:
            addr = ipaddress.IPv6Address(text)
        except ValueError:
            try:
                ipaddress.IPv4Address(text)
            except ValueError:
                raise self.fail(key, f"not an IPv6 address: {text!r}") from None
            raise self.fail(key, f"{text!r} is IPv4: MRC runs over IPv6") from None
        if addr.is_unspecified or addr.is_loopback or addr.is_multicast:
            raise self.fail(key, f"{addr} is not a unicast address")
        if addr.is_link_local and not link_local:
            raise self.fail(key, f"{addr} is link-local: a routed (global or unique-local) address is needed")
        if addr.scope_id is not None and not (link_local and addr.is_link_local):
            raise self.fail(key, f"{_show(text)}: only a link-local next hop takes a %scope")
        return addr

    def network(self, key: str, value: Any, example: str) -> ipaddress.IPv6Network:
        text = self.string(key, value, example)
        try:
            net = ipaddress.IPv6Network(text)
        except ValueError as e:
            raise self.fail(key, f"not an IPv6 prefix: {e}") from None
        if net.network_address.scope_id is not None:
            # ipaddress takes fe80::%eth0/64; no route or SRv6 block can be installed with it, and that
            # failed only when mrcd set the host up, after --check-config had passed
            raise self.fail(key, f"{_show(text)}: a prefix takes no %scope (write it as {example!r})")
        return net


def unknown_key(key: str, known: tuple[str, ...]) -> str:
    """``unknown key 'adress' (did you mean 'address'?)``, else the list of the table's keys."""
    near = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    if near:
        return f"unknown key {key!r} (did you mean {near[0]!r}?)"
    return f"unknown key {key!r} (expected one of: {', '.join(known)})"


def load(path: str | FsPath) -> HostConfig:
    """Load a host configuration file (docs/deploy.md). Every error is a `HostConfigError` (a
    ConfigError) reading ``FILE:LINE: key: problem``; syntax errors and bytes that are not UTF-8 give
    their line; a referenced topology file's errors keep its own name and line."""
    if not str(path):  # FsPath("") is "." : "cannot read: Is a directory" named no file at all
        raise HostConfigError("''", None, "no configuration file named (an empty path)")
    p = FsPath(path)
    return loads(topology.read_text(p, HostConfigError), str(p), base=p.parent)


def loads(text: str, source: str = "<string>", *, base: FsPath | None = None) -> HostConfig:
    """A host configuration from its text; `source` names it in errors, `base` is where a relative
    ``fabric.topology`` is found (default: `source`'s directory)."""
    doc = topology.parse_toml(text, source, HostConfigError)
    d = _Doc(source, key_lines(text))
    return _build(d, doc, FsPath(source).parent if base is None else base)


def _build(d: _Doc, doc: Mapping[str, Any], base: FsPath) -> HostConfig:
    d.table("", doc, _TOP)
    if "host" not in doc:
        raise d.fail("host", "missing table: [host] with name and mrc_address")
    # [host]'s own keys first: "plane = [...]" written under [host] is host.plane, not a missing plane
    host_doc = d.table("host", doc["host"], _HOST)
    if "plane" not in doc:
        raise d.fail("plane", "missing one [[plane]] table per plane port")
    if "fabric" not in doc:
        raise d.fail("fabric", "missing table: [fabric] with topology and host, or shape and [[peer]] tables")
    fab_doc = d.table("fabric", doc["fabric"], _FABRIC)
    topo = _topology(d, fab_doc, base)
    if "name" not in host_doc:
        raise d.fail("host.name", "missing field")
    name = d.name("host.name", host_doc["name"])
    fabric = _fabric(d, fab_doc, topo, base, name)
    mrc_address, mrc_prefix = _host_addresses(d, host_doc, fabric)
    planes, positions = _planes(d, doc["plane"], fabric)
    engine = _engine(d, doc.get("engine", {}), len(planes))
    if fabric.topology is not None:
        if "peer" in doc:
            raise d.fail("peer", "not with fabric.topology: the topology gives the peers")
        _check_topology_paths(d, fabric)
        peers = _topology_peers(fabric)
    else:
        if "peer" not in doc:
            raise d.fail("peer", "missing: one [[peer]] table per peer (or fabric.topology)")
        peers = _peers(d, doc["peer"], fabric, name, len(planes), engine.evs)
    cfg = HostConfig(d.source, name, mrc_address, mrc_prefix, planes, fabric, peers, engine,
                     _metrics(d, doc), _control(d, doc), d.lines)
    _check_addresses(d, cfg, positions)
    return cfg


def _topology(d: _Doc, fab: Mapping[str, Any], base: FsPath) -> Topology | None:
    if "topology" not in fab:
        return None
    text = d.string("fabric.topology", fab["topology"], "default.toml")
    if not text:
        raise d.fail("fabric.topology", "empty path: name a topology file, e.g. 'default.toml'")
    if "\0" in text:
        raise d.fail("fabric.topology", f"{_show(text)}: a path has no NUL character")
    # relative to this file's directory, or the shipped example of a bare name (so the clos example
    # works installed as /etc/mrc/mrcd.toml)
    path = topology.example_path(text, base=base)
    shown = _show_path(path)
    try:
        st = os.stat(path)
    except OSError as e:
        if e.errno == errno.ENOENT:
            raise d.fail("fabric.topology", f"no such file: {shown}") from None
        raise d.fail("fabric.topology", f"cannot read {shown}: {e.strerror or e}") from None
    if stat.S_ISDIR(st.st_mode):
        raise d.fail("fabric.topology", f"{shown} is a directory, not a topology file")
    if not stat.S_ISREG(st.st_mode):
        raise d.fail("fabric.topology", f"{shown} is not a regular file (a topology file is one)")
    try:
        return topology.load(path)
    except FileError as e:  # the topology's own FILE:LINE: key: problem
        raise HostConfigError(e.source, e.key, e.problem, e.line) from None


def _fabric(d: _Doc, fab: Mapping[str, Any], topo: Topology | None, base: FsPath, name: str) -> Fabric:
    if topo is not None:
        for key in ("usid_block",):
            if key in fab:
                raise d.fail(f"fabric.{key}", "not with fabric.topology: the topology's addressing applies")
        if "shape" in fab and d.choice("fabric.shape", fab["shape"], SHAPES) != "clos":
            raise d.fail("fabric.shape", "a topology is a clos: leave shape out or write \"clos\"")
        host = d.string("fabric.host", fab["host"], "h0") if "host" in fab else name
        if host not in topo.host_names():
            raise d.fail("fabric.host", f"no host {host!r} in {topo.source} "
                                        f"(hosts: {', '.join(topo.host_names())})")
        return Fabric("clos", topo.usid_block, FsPath(topo.source), topo, host)  # the file _topology read
    if "host" in fab:
        raise d.fail("fabric.host", "only with fabric.topology (the name of this host in the topology)")
    if "shape" not in fab:
        raise d.fail("fabric.shape", "missing field: \"back-to-back\" or \"clos\" (or fabric.topology)")
    shape = cast(Shape, d.choice("fabric.shape", fab["shape"], SHAPES))
    block = topology.DEFAULT_USID_BLOCK
    if "usid_block" in fab:
        if shape == "back-to-back":
            raise d.fail("fabric.usid_block", "a back-to-back fabric has no switches, hence no micro-SIDs")
        block = d.network("fabric.usid_block", fab["usid_block"], "fcbb:bbbb::/32")
        if block.prefixlen % USID_BITS or not 16 <= block.prefixlen <= 112:
            raise d.fail("fabric.usid_block", f"{block} must be a /16, /32, /48 ... /112 "
                                              "(16-bit micro-SIDs follow it)")
    return Fabric(shape, block)


def _host_addresses(d: _Doc, host: Mapping[str, Any],
                    fabric: Fabric) -> tuple[ipaddress.IPv6Address, ipaddress.IPv6Network | None]:
    topo = fabric.topology
    prefix = d.network("host.mrc_prefix", host["mrc_prefix"], "fd00::/48") if "mrc_prefix" in host else None
    if topo is not None:
        assert fabric.host is not None
        want = topo.mrc_address(fabric.host)
        if "mrc_address" in host and (addr := d.address("host.mrc_address", host["mrc_address"])) != want:
            raise d.fail("host.mrc_address", f"{addr} is not {fabric.host}'s MRC address in the topology "
                                             f"({want})")
        if prefix is not None and prefix != topo.mrc_prefix:
            raise d.fail("host.mrc_prefix", f"{prefix} is not the topology's mrc_prefix ({topo.mrc_prefix})")
        return want, topo.mrc_prefix
    if "mrc_address" not in host:
        raise d.fail("host.mrc_address", "missing field: this host's MRC address (its GID), "
                                         "e.g. 'fd00:0:0:1::1'")
    addr = d.address("host.mrc_address", host["mrc_address"])
    if prefix is not None and addr not in prefix:
        raise d.fail("host.mrc_prefix", f"{prefix} does not hold host.mrc_address {addr}")
    return addr, prefix


def _port_selector(d: _Doc, key: str, p: Mapping[str, Any]) -> tuple[str | None, str | None, str | None]:
    given = [k for k in ("interface", "pci", "mac") if k in p]
    if len(given) != 1:
        problem = ("missing: one of interface, pci, mac (the NIC port)" if not given
                   else f"gives {' and '.join(given)}: exactly one of interface, pci, mac selects the port")
        raise d.fail(f"{key}.{given[1]}" if len(given) > 1 else key, problem)
    which = given[0]
    text = d.string(f"{key}.{which}", p[which], {"interface": "eth1", "pci": "0000:3b:00.0",
                                                 "mac": "02:00:00:00:01:01"}[which])
    if which == "interface":
        if (not text or len(text.encode()) > IFNAMSIZ or text in (".", "..")
                or any(c in text for c in "/:") or any(c.isspace() or not c.isprintable() for c in text)):
            raise d.fail(f"{key}.interface", f"{text!r} is not an interface name (1..{IFNAMSIZ} bytes, "
                                             "no '/', ':', blanks or control characters)")
        return text, None, None
    low = text.lower()
    if which == "pci":
        m = _PCI_RE.match(low)
        if m is None:
            raise d.fail(f"{key}.pci", f"{text!r} is not a PCI address (DDDD:BB:DD.F, e.g. '0000:3b:00.0')")
        return None, f"{m.group(1) or '0000'}:{m.group(2)}:{m.group(3)}.{m.group(4)}", None
    if not _MAC_RE.match(low):
        raise d.fail(f"{key}.mac", f"{text!r} is not a MAC address (six hex pairs: '02:00:00:00:01:01')")
    if int(low[:2], 16) & 1 or low == "00:00:00:00:00:00":
        raise d.fail(f"{key}.mac", f"{text} is not a port's unicast MAC address")
    return None, None, low


def _plane(d: _Doc, key: str, p: Mapping[str, Any], index: int, fabric: Fabric) -> Plane:
    interface, pci, mac = _port_selector(d, key, p)
    topo = fabric.topology
    link = None
    if topo is not None and index < topo.planes:
        assert fabric.host is not None
        link = topo.link_between(fabric.host, topo.leaf_name(index, topo.host_leaf(fabric.host)))
    if "address" in p:
        text = d.string(f"{key}.address", p["address"], "fc00:0:1::1/64")
        if "%" in text:  # IPv6Interface takes "addr%scope/len" and drops the scope without a word
            raise d.fail(f"{key}.address", f"{_show(text)}: a port's address takes no %scope (the port is "
                                           "its scope)")
        try:
            addr = ipaddress.IPv6Interface(text)
        except ValueError:
            raise d.fail(f"{key}.address", f"not an IPv6 address or address/prefix: {text!r}") from None
        d.address(f"{key}.address", str(addr.ip))
        if addr.network.prefixlen < MIN_PORT_PREFIX:  # its on-link route: at /0 a default route
            raise d.fail(f"{key}.address", f"{text!r}: a port's prefix is /{MIN_PORT_PREFIX}../128 (mrcd "
                                           f"installs an on-link route for it; /{addr.network.prefixlen} "
                                           "would take over other traffic)")
        if link is not None and addr.ip != link.a_addr:
            raise d.fail(f"{key}.address", f"{addr.ip} is not {fabric.host}'s plane-{index} port address in "
                                           f"the topology ({link.a_addr})")
    elif link is not None:
        addr = ipaddress.IPv6Interface(f"{link.a_addr}/{link.prefix.prefixlen}")
    else:
        raise d.fail(f"{key}.address", "missing field: this port's IPv6 address, e.g. 'fc00:0:1::1/64'")
    gateway = d.address(f"{key}.gateway", p["gateway"], link_local=True) if "gateway" in p else None
    if gateway is not None and gateway.scope_id is not None and gateway.scope_id != interface:
        raise d.fail(f"{key}.gateway", (
            f"{gateway}: the %scope must be this plane's interface ({interface})" if interface is not None
            else f"{gateway}: a %scope must name this plane's interface, and this plane is selected by "
                 f"{'pci' if pci is not None else 'mac'}: leave the scope out (a link-local gateway is on "
                 "this plane's port)"))
    if gateway is not None and fabric.shape == "back-to-back":
        raise d.fail(f"{key}.gateway", "a back-to-back plane has no gateway: the next hop is the peer's port")
    if gateway is None and link is not None:
        gateway = link.b_addr
    if gateway is None and fabric.shape == "clos":
        raise d.fail(f"{key}.gateway", "missing field: a clos plane's next hop (its first switch's address)")
    xdp = cast(XdpMode, d.choice(f"{key}.xdp", p["xdp"], XDP_MODES)) if "xdp" in p else "auto"
    rate: int | None = None
    if "rate" in p:
        try:
            rate = parse_rate(p["rate"])
        except (ValueError, OverflowError) as e:
            raise d.fail(f"{key}.rate", str(e)) from None
        if problem := rate_problem(rate):
            raise d.fail(f"{key}.rate", problem)
    elif link is not None and topo is not None:
        rate = topo.link_rate_bps(link.a, link.b)
    return Plane(index, addr, interface, pci, mac, gateway, xdp, rate, key)


def _planes(d: _Doc, raw: Any, fabric: Fabric) -> tuple[tuple[Plane, ...], dict[int, int]]:
    """The planes in index order, and each index's table position (what keys and lines are named by)."""
    items = d.array("plane", raw)
    if not 1 <= len(items) <= MAX_PLANES:
        raise d.fail("plane", f"need 1..{MAX_PLANES} [[plane]] tables, got {len(items)}")
    topo = fabric.topology
    if topo is not None and len(items) != topo.planes:
        raise d.fail("plane", f"{len(items)} [[plane]] tables, but the topology {topo.source} has "
                              f"{topo.planes} planes")
    indexes: dict[int, int] = {}
    for i, item in enumerate(items):
        d.table(f"plane[{i}]", item, _PLANE)
        idx = d.integer(f"plane[{i}].index", item["index"], 0, len(items) - 1) if "index" in item else i
        if idx in indexes:
            key = f"plane[{i}].index" if "index" in item else f"plane[{i}]"
            raise d.fail(key, f"plane {idx} is already plane[{indexes[idx]}]")
        indexes[idx] = i
    planes = [_plane(d, f"plane[{i}]", items[i], idx, fabric) for idx, i in sorted(indexes.items())]
    seen: dict[str, str] = {}
    for p in planes:
        key = f"plane[{indexes[p.index]}]"
        for what, value in (("interface", p.interface), ("pci", p.pci), ("mac", p.mac),
                            ("address", None if p.address is None else str(p.address.ip))):
            if value is None:
                continue
            tag = f"{what} {value}"
            if tag in seen:
                raise d.fail(f"{key}.{what}", f"{value} is already {seen[tag]}")
            seen[tag] = f"{key}.{what}"
    return tuple(planes), indexes


def _engine(d: _Doc, raw: Any, planes: int) -> Engine:
    e = d.table("engine", raw, _ENGINE)
    dflt = Engine()

    def num(key: str, lo: int, hi: int, default: int) -> int:
        return d.integer(f"engine.{key}", e[key], lo, hi) if key in e else default

    evs = num("evs", 1, MAX_EVS, dflt.evs)
    if evs < planes:
        raise d.fail("engine.evs", f"{evs} EVs: need at least one EV per plane ({planes} planes)")
    cc = cast(Cc, d.choice("engine.cc", e["cc"], CC_NAMES)) if "cc" in e else dflt.cc
    window = None
    if "max_window" in e:
        try:
            window = parse_size(e["max_window"])
        except (ValueError, OverflowError) as err:
            raise d.fail("engine.max_window", str(err)) from None
        if not MIN_WINDOW <= window <= MAX_WINDOW:
            raise d.fail("engine.max_window", f"must be 8KiB..1GiB ({MIN_WINDOW}..{MAX_WINDOW} bytes), "
                                              f"got {window}")
    mtu = None
    if "mtu" in e and e["mtu"] != "auto":
        try:
            mtu = parse_size(e["mtu"])
        except (ValueError, OverflowError) as err:
            raise d.fail("engine.mtu", f"must be \"auto\" or a payload size: {err}") from None
        if not MIN_PAYLOAD <= mtu <= MAX_PAYLOAD or mtu & (mtu - 1):
            raise d.fail("engine.mtu", f"must be \"auto\" or a power of two {MIN_PAYLOAD}..{MAX_PAYLOAD} "
                                       f"(payload bytes per packet), got {mtu}")
    return Engine(evs, cc, num("reorder_us", 1, MAX_US, dflt.reorder_us),
                  num("probe_timeout_us", 1, MAX_US, dflt.probe_timeout_us),
                  num("ack_timeout", 0, 24, dflt.ack_timeout),
                  num("base_rtt_us", 1, MAX_US, dflt.base_rtt_us), window, mtu)


def topology_path_count(topo: Topology, host: str) -> int:
    """How many paths `host` has toward all its peers in `topo`, over all planes (one within a leaf,
    one per spine toward another leaf), counted without building them."""
    leaf = topo.host_leaf(host)
    same = sum(1 for _, x in topo.hosts if x == leaf) - 1
    other = len(topo.hosts) - 1 - same
    return topo.planes * (same + other * topo.spines)


def _check_topology_paths(d: _Doc, fabric: Fabric) -> None:
    topo, host = fabric.topology, fabric.host
    assert topo is not None and host is not None
    total = topology_path_count(topo, host)
    if total > MAX_PATHS:
        raise d.fail("fabric.topology", (
            f"{topo.source} gives {host} {len(topo.hosts) - 1} peers over {topo.planes} planes with "
            f"{topo.spines} paths per plane toward a peer on another leaf: {total} paths, but a host's "
            f"configuration may hold at most {MAX_PATHS} (fewer hosts, planes or spines; "
            "docs/deploy.md, \"Limits\")"))


def _topology_peers(fabric: Fabric) -> tuple[Peer, ...]:
    topo = fabric.topology
    assert topo is not None and fabric.host is not None
    out = []
    for h in topo.host_names():
        if h == fabric.host:
            continue
        planes = tuple(PeerPlane(topo.port_address(h, p), tuple(PathSpec(x.container, x.usids)
                                                                for x in _by_spine(topo, fabric.host, h, p)))
                       for p in range(topo.planes))
        out.append(Peer(h, topo.mrc_address(h), planes))
    return tuple(out)


def _path(d: _Doc, key: str, raw: Any, block: ipaddress.IPv6Network) -> PathSpec:
    """A path: a string (the container: outer destination address) or a list of 16-bit micro-SIDs that
    `block` prefixes."""
    room = (128 - block.prefixlen) // USID_BITS
    if isinstance(raw, list):
        if not 1 <= len(raw) <= room:
            raise d.fail(key, f"a container in {block} holds 1..{room} micro-SIDs, got {len(raw)}")
        usids = tuple(d.integer(key, u, 1, 0xFFFF) for u in raw)
        value = int(block.network_address)
        for i, u in enumerate(usids):
            value |= u << (128 - block.prefixlen - USID_BITS * (i + 1))
        return PathSpec(ipaddress.IPv6Address(value), usids)
    if not isinstance(raw, str):
        raise d.fail(key, f"a path is a container address ('fcbb:bbbb:100:200:101:302::') or a list of "
                          f"micro-SIDs ([0x0100, 0x0200, 0x0101, 0x0302]), got {_show(raw)}")
    addr = d.address(key, raw)
    return PathSpec(addr, _usids(addr, block))


def _usids(addr: ipaddress.IPv6Address, block: ipaddress.IPv6Network) -> tuple[int, ...]:
    """The micro-SIDs of a container in `block` (empty: not in it, or not a plain uSID list)."""
    if addr not in block:
        return ()
    rest = 128 - block.prefixlen
    bits = int(addr) & ((1 << rest) - 1)
    ids = [(bits >> (rest - USID_BITS * (i + 1))) & 0xFFFF for i in range(rest // USID_BITS)]
    n = next((i for i, u in enumerate(ids) if u == 0), len(ids))
    if n == 0 or any(ids[n:]):
        return ()
    return tuple(ids[:n])


def _peers(d: _Doc, raw: Any, fabric: Fabric, host: str, planes: int, evs: int) -> tuple[Peer, ...]:
    items = d.array("peer", raw)
    if not items:
        raise d.fail("peer", "no [[peer]] table: list the hosts this one talks to")
    if fabric.shape == "back-to-back" and len(items) != 1:
        raise d.fail("peer[1]" if len(items) > 1 else "peer",
                     f"a back-to-back host has exactly one peer (one link per plane), got {len(items)}")
    if len(items) > MAX_PEERS:
        raise d.fail("peer", f"{len(items)} [[peer]] tables: at most {MAX_PEERS} (as many peers as the "
                             f"largest topology, {MAX_HOSTS} hosts, gives a host)")
    out: list[Peer] = []
    names: dict[str, int] = {}
    total = 0  # paths toward the peers so far (a plane without paths: one)
    for i, item in enumerate(items):
        key = f"peer[{i}]"
        d.table(key, item, _PEER)
        for k in ("name", "mrc_address", "plane"):
            if k not in item:
                raise d.fail(f"{key}.{k}", "missing field" if k != "plane"
                             else "missing: one [[peer.plane]] table per plane, in the host's plane order")
        name = d.name(f"{key}.name", item["name"])
        if name == host:
            raise d.fail(f"{key}.name", f"{name!r} is this host's own name (host.name)")
        if name in names:
            raise d.fail(f"{key}.name", f"{name!r} is already peer[{names[name]}]")
        names[name] = i
        addr = d.address(f"{key}.mrc_address", item["mrc_address"])
        pls = d.array(f"{key}.plane", item["plane"])
        if len(pls) != planes:
            raise d.fail(f"{key}.plane", f"{len(pls)} [[peer.plane]] tables, but this host has {planes} "
                                         "planes")
        pps = []
        for p, pl in enumerate(pls):
            pkey = f"{key}.plane[{p}]"
            d.table(pkey, pl, _PEER_PLANE)
            if "address" not in pl:
                raise d.fail(f"{pkey}.address", "missing field: the peer's address on this plane")
            paddr = d.address(f"{pkey}.address", pl["address"])
            paths: list[PathSpec] = []
            if "paths" in pl:
                if fabric.shape == "back-to-back":
                    raise d.fail(f"{pkey}.paths", "a back-to-back plane has one path, the link: no paths")
                if not isinstance(pl["paths"], list) or not pl["paths"]:
                    raise d.fail(f"{pkey}.paths", "must be a non-empty array of paths, "
                                                  f"got {_show(pl['paths'])}")
                on_plane = len(range(p, evs, planes))
                if len(pl["paths"]) > on_plane:
                    raise d.fail(f"{pkey}.paths", f"{len(pl['paths'])} paths, but only {on_plane} of the "
                                                  f"{evs} EVs land on plane {p}: raise engine.evs or "
                                                  "list fewer")
                if total + len(pl["paths"]) > MAX_PATHS:
                    raise d.fail(f"{pkey}.paths", f"{total + len(pl['paths'])} paths toward the peers up "
                                                  "to here: a host's configuration may hold at most "
                                                  f"{MAX_PATHS} (docs/deploy.md, \"Limits\")")
                containers: set[ipaddress.IPv6Address] = set()
                for n, x in enumerate(pl["paths"]):
                    spec = _path(d, f"{pkey}.paths[{n}]", x, fabric.usid_block)
                    if spec.container in containers:
                        raise d.fail(f"{pkey}.paths[{n}]", f"{spec.container} is listed twice")
                    containers.add(spec.container)
                    paths.append(spec)
            total += max(1, len(paths))
            if total > MAX_PATHS:
                raise d.fail(pkey, f"{total} paths toward the peers up to here: a host's configuration may "
                                   f"hold at most {MAX_PATHS} (docs/deploy.md, \"Limits\")")
            pps.append(PeerPlane(paddr, tuple(paths)))
        out.append(Peer(name, addr, tuple(pps)))
    return tuple(out)


def _metrics(d: _Doc, doc: Mapping[str, Any]) -> tuple[str, int] | None:
    if "metrics" not in doc:
        return None
    m = d.table("metrics", doc["metrics"], _METRICS)
    text = d.string("metrics.address", m["address"], DEFAULT_METRICS) if "address" in m else DEFAULT_METRICS
    host, _, port = text.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(bare)
    except ValueError:
        ip = None
    # at most five digits before int(): a port of thousands of digits is past Python's int() limit
    digits = port.isascii() and port.isdigit() and len(port) <= 5
    if ip is None or not digits or not 1 <= int(port) <= 65535 or (ip.version == 6) != (bare != host):
        raise d.fail("metrics.address", f"{_show(text)} must be ADDRESS:PORT such as '127.0.0.1:9470' or "
                                        "'[::1]:9470' (a port 1..65535)")
    return str(ip), int(port)


def _control(d: _Doc, doc: Mapping[str, Any]) -> FsPath:
    c = d.table("control", doc.get("control", {}), _CONTROL)
    if "socket" not in c:
        return FsPath(DEFAULT_SOCKET)
    text = d.string("control.socket", c["socket"], DEFAULT_SOCKET)
    if not text.startswith("/") or text.endswith("/") or not text.isprintable():
        raise d.fail("control.socket", f"{text!r} must be an absolute file path such as {DEFAULT_SOCKET!r} "
                                       "(printable characters)")
    if len(text.encode()) > MAX_SOCKET_PATH:
        raise d.fail("control.socket", f"{len(text.encode())} bytes: a socket path holds at most "
                                       f"{MAX_SOCKET_PATH}")
    try:  # mrcd (root) replaces a stale socket there, nothing else: refused now, not at start
        mode = os.lstat(text).st_mode
    except OSError:
        mode = None
    if mode is not None and not stat.S_ISSOCK(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a file that is not a socket"
        raise d.fail("control.socket", f"{text!r} is {kind}; mrcd replaces only a socket there")
    return FsPath(text)


def _addresses(cfg: HostConfig, positions: Mapping[int, int]) -> Iterator[tuple[str, ipaddress.IPv6Address]]:
    """(key, address) of every address the file names, host first: each must be unique. A plane's key
    is its table's position in the file (`positions`: plane index -> position), as every other plane
    key is: ``index`` may order the planes otherwise."""
    yield "host.mrc_address", cfg.mrc_address
    for p in cfg.planes:
        yield f"plane[{positions.get(p.index, p.index)}].address", p.address.ip
    for i, peer in enumerate(cfg.peers):
        yield f"peer[{i}].mrc_address", peer.mrc_address
        for n, pp in enumerate(peer.planes):
            yield f"peer[{i}].plane[{n}].address", pp.address


def _check_gateways(d: _Doc, cfg: HostConfig, positions: Mapping[int, int]) -> None:
    """A gateway is the first switch: not this host's own address (its MRC address, a port's) nor a
    peer's port. Compared without the %scope."""
    own = {cfg.mrc_address: "host.mrc_address"}
    own.update((p.address.ip, f"plane[{positions.get(p.index, p.index)}].address") for p in cfg.planes)
    gateways: dict[ipaddress.IPv6Address, str] = {}
    for p in cfg.planes:
        if p.gateway is None:
            continue
        bare = ipaddress.IPv6Address(int(p.gateway))
        key = f"plane[{positions.get(p.index, p.index)}].gateway"
        if bare in own:
            raise d.fail(key, f"{p.gateway} is {own[bare]}, this host's own: the gateway is the first switch "
                              "on the plane")
        gateways.setdefault(bare, key)
    if not gateways:
        return
    for i, peer in enumerate(cfg.peers):
        for n, pp in enumerate(peer.planes):
            if pp.address in gateways:
                raise d.fail(f"peer[{i}].plane[{n}].address",
                             f"{pp.address} is {gateways[pp.address]}: a peer's port is not the first switch")


def _check_addresses(d: _Doc, cfg: HostConfig, positions: Mapping[int, int]) -> None:
    _check_gateways(d, cfg, positions)
    if cfg.fabric.topology is not None:
        return  # the topology's addressing is unique by construction (tested there)
    seen: dict[ipaddress.IPv6Address, str] = {}
    for key, addr in _addresses(cfg, positions):
        if addr in seen:
            first = seen[addr]
            own = first.startswith(("host.", "plane[")) and key.startswith("peer")
            own_text = " (this host's own)" if own else ""
            raise d.fail(key, f"{addr} is already {first}{own_text}")
        seen[addr] = key
        if key.endswith(".mrc_address") and cfg.mrc_prefix is not None and addr not in cfg.mrc_prefix:
            raise d.fail(key, f"{addr} is not in host.mrc_prefix {cfg.mrc_prefix}")
