"""Where one mrcd runs: what its `Daemon` needs from the place, in two kinds.

* `TestbedSite`: a host namespace of a testbed (``mrcd --testbed NAME --host H``): identity, ports and
  paths from the testbed's topology, the dataplane the testbed attached (`FabricDataplane`), peers'
  control sockets next to its own (they get the controller's `link_status` notes).
* `ConfigSite`: a real host (``mrcd --config FILE``): identity, ports and paths from the host
  configuration file (`mrc.hostconfig`), the dataplane mrcd installs itself (`HostDataplane`) and removes
  on stop. Peers' mrcds run on other machines: their control sockets are out of reach, so no
  `link_status` notes are sent; each mrcd localises failures from its own traffic.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from mrc import hostconfig
from mrc.dataplane import netns
from mrc.dataplane import testbed as tbmod
from mrc.dataplane.client import socket_path
from mrc.dataplane.fabric import FabricDataplane
from mrc.dataplane.host import HostDataplane, site_name
from mrc.errors import MrcError
from mrc.hostconfig import HostConfig
from mrc.topology import Path as TopoPath
from mrc.transport import NsccConfig, QpAttr
from mrc.wire.packet import payload_for_mtu

from .controller import FabricView, Link, TopologyView
from .host_engine import DEFAULT_EVS, PathWriter
from .metrics import dataplane_attached

#: The testbed's base RTT (what NSCC's window and increase periods are sized for).
TESTBED_BASE_RTT_NS = 500_000
#: NSCC's target queuing delay on the testbed, above the end hosts' own latency. NSCC reads the queuing
#: delay as RTT - service time - base RTT; on the testbed that includes the time a data packet or a
#: SACK waits in its socket until a Python mrcd sharing two CPUs with the ranks is scheduled: 1.6-7 ms per
#: QP (qp_stats cc.avg_delay_ns) during the demo's uncompressed ring, with no ECN mark and no queue
#: drop anywhere in the fabric. At the default target (0.75 x the base RTT) every QP's quick adapt then
#: fired ~100 times a second and held its window near one packet (cc.qa_count, min_cwnd_seen); above
#: the hosts' latency the window is left to ECN, trims and losses, the signals of the fabric
#: (docs/daemon.md, "Window and timers").
TESTBED_TARGET_DELAY_NS = 5_000_000
#: ``MRC_TESTBED_TARGET_US``: the target in microseconds instead (0: the engine's default, 0.75 x the base
#: RTT, as before this profile; for side-by-side runs), read when a testbed mrcd starts.
TARGET_ENV = "MRC_TESTBED_TARGET_US"


def testbed_target_delay_ns() -> int | None:
    """TESTBED_TARGET_DELAY_NS, or what MRC_TESTBED_TARGET_US says (None: the engine's default)."""
    raw = os.environ.get(TARGET_ENV, "").strip()
    if not raw:
        return TESTBED_TARGET_DELAY_NS
    try:
        us = int(raw)
    except ValueError:
        raise MrcError(f"{TARGET_ENV}={raw!r}: expected a whole number of microseconds") from None
    if not 0 <= us <= 1_000_000:
        raise MrcError(f"{TARGET_ENV}={us}: expected 0 (the engine's default) .. 1000000 microseconds")
    return us * 1000 if us else None


def testbed_nscc(planes: int, rate_bps: int, buffer_bytes: int, mtu: int,
                 target_delay_ns: int | None = TESTBED_TARGET_DELAY_NS) -> NsccConfig:
    """The NSCC profile of a testbed mrcd: the host's window 1.5 x the BDP at TESTBED_BASE_RTT_NS,
    which is at least a third of the plane queues' buffers together (so that they ECN-mark but rarely
    drop) and at most all of them (hostconfig.window_bdp, docs/daemon.md), and the target delay
    (None: the engine's default)."""
    bdp = hostconfig.window_bdp(planes, planes * rate_bps, buffer_bytes, TESTBED_BASE_RTT_NS)
    return NsccConfig.for_path(TESTBED_BASE_RTT_NS, bdp, mtu, target_delay_ns=target_delay_ns)


class Site(Protocol):
    name: str  # the testbed's name, or host:<name> (hello's "testbed", the programs' records)
    host: str
    fabric: FabricView
    ns: str  # where the MRC socket lives (netns.HERE: the process's own namespace)
    socket_file: Path
    port_ifname: list[str]
    port_rate_bps: list[int]
    evs: int
    qp_attr: QpAttr
    nscc: NsccConfig | None  # None: QPs without congestion control
    paths: PathWriter

    def ifindex_plane(self) -> dict[int, int]:
        """Plane port ifindex -> plane (the driver's arrival port)."""

    def host_stats(self) -> dict[str, Any]: ...

    def attached(self) -> dict[str, bool]: ...

    def port_rx_packets(self, plane: int) -> int | None: ...

    def peer_socket(self, peer: str) -> str | None:
        """The control socket of `peer`'s mrcd, where a `link_status` note reaches it (None: none)."""

    def poll(self) -> None:
        """Housekeeping the loop runs about once a second (a real host: next hops still unresolved)."""

    def close(self) -> None: ...


class FabricPaths:
    """The `PathWriter` of one testbed host: its entries in the host programs' path and allowed-QP maps."""

    def __init__(self, fd: FabricDataplane, host: str) -> None:
        self.fd = fd
        self.host = host

    def set_path(self, peer: str, ev: int, path: TopoPath) -> None:
        self.fd.set_path(self.host, peer, ev, path)

    def delete_path(self, peer: str, ev: int) -> None:
        with contextlib.suppress(MrcError, OSError):
            self.fd.delete_path(self.host, peer, ev)

    def allow_qp(self, qpn: int) -> None:
        self.fd.allow_qps(self.host, [qpn])

    def disallow_qp(self, qpn: int) -> None:
        with contextlib.suppress(MrcError, OSError):
            self.fd.disallow_qp(self.host, qpn)


class TestbedSite:
    __test__ = False  # not a pytest class

    def __init__(self, testbed: str, host: str, *, evs: int = DEFAULT_EVS, socket_file: Path | None = None,
                 reorder_ns: int = 2_000_000, probe_timeout_ns: int = 20_000_000) -> None:
        self.tb = tbmod.Testbed.load(testbed)
        topo = self.tb.topo
        if host not in topo.host_names():
            raise MrcError(f"testbed {testbed}: no host {host!r} (hosts: {', '.join(topo.host_names())})")
        if evs < topo.planes:
            raise MrcError(f"--evs {evs}: need at least one EV per plane ({topo.planes})")
        self.name = self.tb.name
        self.host = host
        self.fabric: FabricView = TopologyView(topo, host)
        self.ns = self.tb.ns(host)
        self.socket_file = socket_file or socket_path(self.ns)
        self.evs = evs
        # an ACK timeout of 1.024 us x 2^15 = 33.6 ms, reordering and probe tolerances of milliseconds:
        # the engines run in Python processes that share two CPUs, a SACK or a probe reply can be late by
        # milliseconds without any loss (docs/daemon.md)
        # the payload per packet: the largest the fabric's links carry whole (8 KiB at the default MTU
        # of 9000), as a RoCE NIC takes its QPs' path MTU from the port's (docs/daemon.md, "Path MTU")
        # no AckReq floor: the delayed ACK (mrcd's, longer on fast links: hostconfig.mrcd_ack_delay_ns)
        # answers within a few loop turns (QpAttr.ack_req_floor)
        mtu = payload_for_mtu(topo.link.mtu)
        delay = hostconfig.mrcd_ack_delay_ns([topo.link.rate_bps] * topo.planes, mtu)
        self.qp_attr = QpAttr(timeout=15, reorder_ns=reorder_ns, probe_timeout_ns=probe_timeout_ns, mtu=mtu,
                              ack_req_floor=0, ack_delay_ns=delay)
        # per plane a link of link.rate (testbed_nscc: the window and the target delay)
        self.nscc: NsccConfig | None = testbed_nscc(topo.planes, topo.link.rate_bps, topo.link.buffer_bytes,
                                                    mtu, testbed_target_delay_ns())
        self.fd = FabricDataplane.open(testbed)
        if self.fd.egress is None or self.fd.ingress is None:
            self.fd.close()
            raise MrcError(f"testbed {testbed}: host_egress/host_ingress not attached (mrcctl prog attach)")
        self.fd.ingress.allocate_id("host", f"{self.tb.name}/{host}")
        leaf = topo.host_leaf(host)
        self.port_ifname = [topo.link_between(host, topo.leaf_name(p, leaf)).a_ifname
                            for p in range(topo.planes)]
        self.port_rate_bps = [topo.link.rate_bps] * topo.planes
        self.paths: PathWriter = FabricPaths(self.fd, host)

    def ifindex_plane(self) -> dict[int, int]:
        return {self.fd.ifindex(self.host, ifn): p for p, ifn in enumerate(self.port_ifname)}

    def host_stats(self) -> dict[str, Any]:
        return self.fd.host_stats(self.host)

    def attached(self) -> dict[str, bool]:
        return dataplane_attached(self.fd.egress, self.fd.ingress, self.tb.name, self.host)

    def port_rx_packets(self, plane: int) -> int | None:
        return self.fd.port_rx_packets(self.host, self.port_ifname[plane])

    def peer_socket(self, peer: str) -> str | None:
        return str(self.socket_file.parent / f"{self.tb.ns(peer)}.sock")

    def poll(self) -> None:
        """Nothing: the testbed's neighbours are permanent entries."""

    def close(self) -> None:
        self.fd.close()


class ConfigView:
    """A host configuration file's fabric seen from its host (`FabricView`)."""

    def __init__(self, cfg: HostConfig) -> None:
        self.cfg = cfg
        self.host = cfg.fabric_host
        self.planes = len(cfg.planes)

    def peer_names(self) -> list[str]:
        return self.cfg.peer_names()

    def plane_paths(self, peer: str, plane: int) -> list[TopoPath]:
        return hostconfig.plane_paths(self.cfg, peer, plane)

    def access_link(self, plane: int) -> Link:
        """The first hop of the plane's paths (every path of a plane leaves by the same port)."""
        peers = self.cfg.peer_names()
        if not peers:
            return frozenset((self.host, f"p{plane}:port"))
        return frozenset(self.plane_paths(peers[0], plane)[0].hops[:2])

    def address(self, host: str) -> ipaddress.IPv6Address:
        return self.cfg.mrc_address if host == self.host else self.cfg.peer(host).mrc_address


class ConfigSite:
    def __init__(self, cfg: HostConfig, *, socket_file: Path | None = None,
                 log: Callable[[str], None] | None = None) -> None:
        self.cfg = cfg
        self.name = site_name(cfg)
        self.host = cfg.fabric_host
        self.fabric: FabricView = ConfigView(cfg)
        self.ns = netns.HERE
        self.socket_file = socket_file or cfg.socket
        self.evs = cfg.engine.evs
        self.hd = HostDataplane(cfg, log=log)
        self.hd.install()
        try:
            payload = hostconfig.payload_size(cfg, self.hd.port_mtus())
        except BaseException:
            self.hd.close()
            raise
        self.port_ifname = [p.ifname for p in self.hd.ports]
        self.port_rate_bps = [p.rate_bps for p in self.hd.ports]
        self.qp_attr = hostconfig.qp_attr(cfg, payload, self.port_rate_bps)
        self.nscc: NsccConfig | None = hostconfig.nscc_config(cfg, payload, self.port_rate_bps)
        self.paths: PathWriter = self.hd

    def ifindex_plane(self) -> dict[int, int]:
        return {p.ifindex: p.plane for p in self.hd.ports}

    def host_stats(self) -> dict[str, Any]:
        return self.hd.host_stats()

    def attached(self) -> dict[str, bool]:
        return self.hd.attached()

    def port_rx_packets(self, plane: int) -> int | None:
        return self.hd.port_rx_packets(plane)

    def peer_socket(self, peer: str) -> str | None:
        return None

    def poll(self) -> None:
        self.hd.poll()

    def close(self) -> None:
        self.hd.close()
