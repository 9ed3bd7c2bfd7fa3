"""The testbed topology model (docs/design.md §6): planes, leaves and spines per plane, hosts, links,
addressing and the full set of micro-SID paths. Pure Python: the netns builder (`mrc.dataplane.testbed`), the
simulator and the daemon all read the same model.

Shape: ``planes`` independent two-tier Clos networks. In plane p there are ``leaves`` leaf switches
``p<p>l<i>`` and ``spines`` spine switches ``p<p>s<j>``; every leaf links to every spine of its plane; every
host has one port per plane, attached to the same leaf index in every plane. No link joins two planes.

Addressing (all derived, nothing to configure per node):

* micro-SID node ID (16 bits, F3216 format in a /32 locator block ``usid_block``):
  ``plane << 12 | role << 8 | index`` with role 1 = leaf, 2 = spine, 3 = host port (index < 256). Plane 0
  leaf 1 is 0x0101, plane 2 spine 0 is 0x2200, host 3's port in plane 1 is 0x1303. Hosts 256..2047 take
  the upper half of the low 12 bits instead: ``plane << 12 | 0x800 | index`` (host 300 in plane 1:
  0x192C), so fabrics beyond 256 hosts keep the IDs of the first 256. Each node owns the /48
  ``block:ID::/48``; a path's container is ``block:ID1:ID2:...::`` (at most six IDs).
* link underlay: the link between a lower node A (host port or leaf) and an upper node B (leaf or spine)
  is ``link_prefix:A:B::/64`` (link_prefix is a /32); A has ``::1``, B has ``::2``. A host's address on the
  link of plane p is its *plane-port address* (the outer source of its MRC packets).
* host MRC address (its "GID"): ``mrc_prefix:<host>::1`` in the host's /64 ``mrc_prefix:<host>::/64``
  (mrc_prefix is a /48). The same /64 holds one *path address* per path the host sources:
  ``mrc_prefix:<host>:a00<plane>:<dst>:<spine + 1, or 0 within a leaf>:1``. Traffic sourced from a path
  address follows exactly that path, and replies to it come back along its reverse.
* MAC addresses: ``02:AA:AA:BB:BB:0s`` from the link's two node IDs and the side s (1 = A, 2 = B).

Paths: for every (source host, destination host, plane), one path per spine when the hosts sit on
different leaves ([source leaf, spine, destination leaf, destination host port]) and one path within a
leaf ([leaf, destination host port]).
"""

from __future__ import annotations

import ipaddress
import os
import re
import stat
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from importlib import resources
from itertools import accumulate
from pathlib import Path as FsPath
from typing import Any, Final

from .errors import ConfigError
from .units import parse_delay_us, parse_rate, parse_size

ROLE_LEAF: Final = 1
ROLE_SPINE: Final = 2
ROLE_HOST: Final = 3
MAX_PLANES: Final = 16
MAX_INDEX: Final = 256  # leaves and spines per plane, and hosts with the role-3 node ID
MAX_HOSTS: Final = 2048  # hosts: 256 with role 3, the rest as 0x800 | index
MAX_USIDS: Final = 6  # 96 bits after a 32-bit block, 16 bits each
IFNAMSIZ: Final = 15
#: Bounds of the link keys (docs/testbed.md, "Topology files"): tc's TBF and the simulator both take any
#: rate in 1 kbit/s .. 1.6 Tbit/s (two 800G ports' worth: nothing faster exists to model), a delay up
#: to one second (a netem delay beyond it models nothing real), and a port buffer of one packet up to
#: 1 GiB (the TBF queue limit and the simulator's drop threshold: both are byte counts, but a larger
#: queue is no switch's).
MIN_RATE_BPS: Final = 1_000
MAX_RATE_BPS: Final = 1_600_000_000_000
MAX_DELAY_US: Final = 1_000_000
MAX_BUFFER_BYTES: Final = 1 << 30
MIN_MTU: Final = 1280  # IPv6's minimum
MAX_MTU: Final = 65535
#: a configuration or topology file is read whole: anything larger is not one (and /dev/zero never ends)
MAX_FILE_BYTES: Final = 16 << 20
DEFAULT_USID_BLOCK: Final = ipaddress.IPv6Network("fcbb:bbbb::/32")
DEFAULT_LINK_PREFIX: Final = ipaddress.IPv6Network("fc00::/32")
DEFAULT_MRC_PREFIX: Final = ipaddress.IPv6Network("fd00::/48")

#: `Topology.link_between` on a fabric of more links than this makes the one link asked for instead of
#: the map of all (16 planes x (2,048 hosts + 256 x 256 leaf-spine links): a million links, 17 s)
_DIRECT_LINKS: Final = 1 << 16
_NAME_RE: Final = re.compile(r"^[a-z][a-z0-9]{0,7}\Z")
_SWITCH_NAME_RE: Final = re.compile(r"^p\d+[ls]\d+\Z")

# ------------------------------------------------------------------------------------------- values


def format_rate(bits: int) -> str:
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits >= scale and bits % scale == 0:
            return f"{bits // scale}{unit}"
    for unit, scale in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bits >= scale:
            return f"{bits / scale:g}{unit}"
    return f"{bits}bit"


def rate_problem(bits: int) -> str | None:
    """Why a link rate in bit/s is out of range (None: it is fine): one rule for the files, the testbed
    and the simulator."""
    if not MIN_RATE_BPS <= bits <= MAX_RATE_BPS:
        return f"must be 1kbit..1600gbit ({MIN_RATE_BPS}..{MAX_RATE_BPS} bit/s), got {bits}"
    return None


def delay_problem(us: int) -> str | None:
    """Why a link delay in µs is out of range (None: it is fine)."""
    if not 0 <= us <= MAX_DELAY_US:
        return f"must be 0..1s (0..{MAX_DELAY_US} us), got {us} us"
    return None


# ------------------------------------------------------------------------------------------- errors


class FileError(ConfigError):
    """A bad TOML file: ``FILE:LINE: key: problem`` (``FILE: key: problem`` when the key has no line, as
    for a missing table or a model built in code; ``FILE:LINE: problem`` for a syntax error). The parts
    stay readable (`source`, `line`, `key`, `problem`) so a loader can add the line that a model, built
    from parsed TOML, cannot know. Shared by the topology files and the host configuration
    (`mrc.hostconfig`)."""

    def __init__(self, source: str, key: str | None, problem: str, line: int | None = None) -> None:
        self.source, self.key, self.problem, self.line = source, key, problem, line
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {problem}" if key is None else f"{where}: {key}: {problem}")


class TopologyError(FileError):
    """A bad topology (`FileError`'s ``FILE:LINE: key: problem``)."""


# ------------------------------------------------------------------------------------------- model


@dataclass(frozen=True)
class LinkParams:
    """What every fabric link gets unless the operator changes one at run time."""

    rate_bps: int = 100_000_000
    delay_us: int = 0
    mtu: int = 9000
    buffer_bytes: int = 131072


@dataclass(frozen=True)
class LinkOverride:
    """One link whose rate or delay differs from `LinkParams` (a degraded or longer link); routing is
    unchanged. Both directions. From a topology file's ``[[link_override]]`` tables."""

    a: str
    b: str
    rate_bps: int | None = None
    delay_us: int | None = None


@dataclass(frozen=True)
class Node:
    name: str
    kind: str  # "host", "leaf", "spine"
    plane: int | None  # None for hosts (they have a port in every plane)
    index: int

    @property
    def is_host(self) -> bool:
        return self.kind == "host"


End = tuple[str, str, ipaddress.IPv6Address, str]  # (node, ifname, address, mac)


@dataclass(frozen=True)
class Link:
    """One veth pair. ``a`` is the lower node (host or leaf), ``b`` the upper one (leaf or spine)."""

    a: str
    b: str
    plane: int
    kind: str  # "host-leaf" or "leaf-spine"
    prefix: ipaddress.IPv6Network
    a_addr: ipaddress.IPv6Address
    b_addr: ipaddress.IPv6Address
    a_mac: str
    b_mac: str

    @property
    def a_ifname(self) -> str:
        """Interface in node a's namespace (named after the node it faces)."""
        return self.b

    @property
    def b_ifname(self) -> str:
        return self.a

    @property
    def key(self) -> tuple[str, str]:
        return (self.a, self.b)

    def ends(self) -> tuple[End, End]:
        """((node, ifname, address, mac) of side a, the same of side b)."""
        return ((self.a, self.a_ifname, self.a_addr, self.a_mac),
                (self.b, self.b_ifname, self.b_addr, self.b_mac))


@dataclass(frozen=True)
class Path:
    """One micro-SID path from ``src`` to ``dst`` in ``plane``, through ``spine`` (None within a leaf)."""

    src: str
    dst: str
    plane: int
    spine: int | None
    hops: tuple[str, ...]  # node names, src first, dst last
    usids: tuple[int, ...]  # the node IDs the container carries, in travel order
    container: ipaddress.IPv6Address
    path_address: ipaddress.IPv6Address  # the source host's address that selects this path

    @property
    def links(self) -> tuple[tuple[str, str], ...]:
        """Consecutive node pairs the path crosses, in travel order."""
        return tuple(zip(self.hops[:-1], self.hops[1:], strict=True))

    @property
    def key(self) -> tuple[str, str, int, int | None]:
        return (self.src, self.dst, self.plane, self.spine)

    def crosses(self, a: str, b: str) -> bool:
        return any({x, y} == {a, b} for x, y in self.links)

    def reverse_hops(self) -> tuple[str, ...]:
        return tuple(reversed(self.hops))


@dataclass(frozen=True)
class Topology:
    planes: int
    leaves: int
    spines: int
    hosts: tuple[tuple[str, int], ...]  # (name, leaf index), in host-index order
    link: LinkParams = field(default_factory=LinkParams)
    usid_block: ipaddress.IPv6Network = DEFAULT_USID_BLOCK
    link_prefix: ipaddress.IPv6Network = DEFAULT_LINK_PREFIX
    mrc_prefix: ipaddress.IPv6Network = DEFAULT_MRC_PREFIX
    link_overrides: tuple[LinkOverride, ...] = ()
    source: str = "<model>"

    def __post_init__(self) -> None:
        for key, problem in self._problems():
            raise TopologyError(self.source, key, problem)

    # -- validation
    def _problems(self) -> Iterator[tuple[str, str]]:
        if not 1 <= self.planes <= MAX_PLANES:
            yield "topology.planes", (f"must be 1..{MAX_PLANES} (the plane is one hex digit of a node ID), "
                                      f"got {self.planes}")
        if not 1 <= self.leaves <= MAX_INDEX:
            yield "topology.leaves", f"must be 1..{MAX_INDEX}, got {self.leaves}"
        if not 0 <= self.spines <= MAX_INDEX:
            yield "topology.spines", f"must be 0..{MAX_INDEX}, got {self.spines}"
        if self.spines == 0 and self.leaves > 1:
            yield "topology.spines", "at least one spine is needed to join more than one leaf"
        if not 2 <= len(self.hosts) <= MAX_HOSTS:
            yield "hosts", f"need 2..{MAX_HOSTS} hosts, got {len(self.hosts)}"
        seen: set[str] = set()
        for i, (name, leaf) in enumerate(self.hosts):
            key = f"hosts[{i}]"
            if not _NAME_RE.match(name):
                yield f"{key}.name", f"{name!r} must be a lowercase letter then up to 7 letters/digits"
            elif _SWITCH_NAME_RE.match(name):
                yield f"{key}.name", f"{name!r} looks like a switch name (p<plane>l<i> / p<plane>s<j>)"
            if name in seen:
                yield f"{key}.name", f"duplicate host name {name!r}"
            seen.add(name)
            if not 0 <= leaf < self.leaves:
                yield f"{key}.leaf", f"leaf {leaf} does not exist (leaves are 0..{self.leaves - 1})"
        lp = self.link
        if not MIN_MTU <= lp.mtu <= MAX_MTU:
            yield "link.mtu", f"must be {MIN_MTU}..{MAX_MTU} (IPv6 minimum {MIN_MTU}), got {lp.mtu}"
        if problem := rate_problem(lp.rate_bps):
            yield "link.rate", problem
        if lp.buffer_bytes < lp.mtu + 64:
            yield "link.buffer", f"{lp.buffer_bytes} bytes cannot hold one {lp.mtu}-byte packet"
        elif lp.buffer_bytes > MAX_BUFFER_BYTES:
            yield "link.buffer", f"must be at most 1 GiB ({MAX_BUFFER_BYTES} bytes), got {lp.buffer_bytes}"
        if problem := delay_problem(lp.delay_us):
            yield "link.delay", problem
        for key, net, plen in (
            ("addressing.usid_block", self.usid_block, 32),
            ("addressing.link_prefix", self.link_prefix, 32),
            ("addressing.mrc_prefix", self.mrc_prefix, 48),
        ):
            if net.prefixlen != plen:
                yield key, f"{net} must be a /{plen}"
        nets = {
            "addressing.usid_block": self.usid_block,
            "addressing.link_prefix": self.link_prefix,
            "addressing.mrc_prefix": self.mrc_prefix,
        }
        names = list(nets)
        for i, k1 in enumerate(names):
            for k2 in names[i + 1:]:
                if nets[k1].overlaps(nets[k2]):
                    yield k2, f"{nets[k2]} overlaps {k1} {nets[k1]} (address clash)"
        yield from self._override_problems()

    def _override_problems(self) -> Iterator[tuple[str, str]]:
        if not self.link_overrides:
            return
        if not all(0 <= leaf < self.leaves for _, leaf in self.hosts) or self.leaves < 1:
            return  # reported above; the links cannot be listed
        seen: set[frozenset[str]] = set()
        for i, o in enumerate(self.link_overrides):
            key = f"link_override[{i}]"
            pair = frozenset((o.a, o.b))
            if pair not in self._link_map:
                yield f"{key}", f"no link between {o.a!r} and {o.b!r}"
                continue
            if pair in seen:
                yield f"{key}", f"a second override of the link {o.a}-{o.b}"
            seen.add(pair)
            if o.rate_bps is None and o.delay_us is None:
                yield f"{key}", "gives neither rate nor delay"
            if o.rate_bps is not None and (problem := rate_problem(o.rate_bps)):
                yield f"{key}.rate", problem
            if o.delay_us is not None and (problem := delay_problem(o.delay_us)):
                yield f"{key}.delay", problem

    # -- nodes
    def host_names(self) -> list[str]:
        return [n for n, _ in self.hosts]

    # indexes, computed once (the model is immutable; the simulator may ask for large fabrics)
    @cached_property
    def _host_idx(self) -> dict[str, int]:
        return {n: i for i, (n, _) in enumerate(self.hosts)}

    @cached_property
    def _nodes(self) -> tuple[Node, ...]:
        out = [Node(name, "host", None, i) for i, (name, _) in enumerate(self.hosts)]
        for p in range(self.planes):
            out += [Node(self.leaf_name(p, i), "leaf", p, i) for i in range(self.leaves)]
            out += [Node(self.spine_name(p, j), "spine", p, j) for j in range(self.spines)]
        return tuple(out)

    @cached_property
    def _node_map(self) -> dict[str, Node]:
        return {n.name: n for n in self._nodes}

    @cached_property
    def _links(self) -> tuple[Link, ...]:
        out: list[Link] = []
        for p in range(self.planes):
            for i, (host, leaf) in enumerate(self.hosts):
                out.append(self._make_link(host, self.leaf_name(p, leaf), p, "host-leaf",
                                           self.usid(p, ROLE_HOST, i), self.usid(p, ROLE_LEAF, leaf)))
            for li in range(self.leaves):
                for sj in range(self.spines):
                    out.append(self._make_link(self.leaf_name(p, li), self.spine_name(p, sj), p, "leaf-spine",
                                               self.usid(p, ROLE_LEAF, li), self.usid(p, ROLE_SPINE, sj)))
        return tuple(out)

    @cached_property
    def _link_map(self) -> dict[frozenset[str], Link]:
        return {frozenset((lk.a, lk.b)): lk for lk in self._links}

    @cached_property
    def _links_by_node(self) -> dict[str, list[Link]]:
        out: dict[str, list[Link]] = {}
        for lk in self._links:
            out.setdefault(lk.a, []).append(lk)
            out.setdefault(lk.b, []).append(lk)
        return out

    def host_index(self, name: str) -> int:
        return self._host_idx[name]

    def host_leaf(self, name: str) -> int:
        return self.hosts[self.host_index(name)][1]

    @staticmethod
    def leaf_name(plane: int, index: int) -> str:
        return f"p{plane}l{index}"

    @staticmethod
    def spine_name(plane: int, index: int) -> str:
        return f"p{plane}s{index}"

    def nodes(self) -> list[Node]:
        return list(self._nodes)

    def node(self, name: str) -> Node:
        return self._node_map[name]

    def switches(self) -> list[Node]:
        return [n for n in self.nodes() if not n.is_host]

    # -- micro-SIDs
    @staticmethod
    def usid(plane: int, role: int, index: int) -> int:
        if role == ROLE_HOST and index >= MAX_INDEX:
            return (plane << 12) | 0x800 | index
        return (plane << 12) | (role << 8) | index

    def node_usid(self, name: str, plane: int | None = None) -> int:
        """A switch's node ID, or a host's node ID in ``plane`` (its port there)."""
        n = self.node(name)
        if n.is_host:
            if plane is None:
                raise ValueError(f"host {name} has one micro-SID per plane: name the plane")
            return self.usid(plane, ROLE_HOST, n.index)
        assert n.plane is not None
        return self.usid(n.plane, ROLE_LEAF if n.kind == "leaf" else ROLE_SPINE, n.index)

    def container(self, usids: tuple[int, ...] | list[int]) -> ipaddress.IPv6Address:
        if not 1 <= len(usids) <= MAX_USIDS:
            raise ValueError(f"a container holds 1..{MAX_USIDS} micro-SIDs, got {len(usids)}")
        value = int(self.usid_block.network_address)
        for i, u in enumerate(usids):
            value |= (u & 0xFFFF) << (80 - 16 * i)
        return ipaddress.IPv6Address(value)

    def usid_prefix(self, name: str, plane: int | None = None) -> ipaddress.IPv6Network:
        """The /48 a node owns (its ``End`` or ``End.DT6`` SID)."""
        return ipaddress.IPv6Network((int(self.container([self.node_usid(name, plane)])), 48))

    # -- addresses
    def mrc_address(self, host: str) -> ipaddress.IPv6Address:
        return ipaddress.IPv6Address(int(self.mrc_prefix.network_address) | (self.host_index(host) << 64) | 1)

    def host_prefix(self, host: str) -> ipaddress.IPv6Network:
        base = int(self.mrc_prefix.network_address)
        return ipaddress.IPv6Network((base | (self.host_index(host) << 64), 64))

    def path_address(self, src: str, dst: str, plane: int, spine: int | None) -> ipaddress.IPv6Address:
        via = 0 if spine is None else spine + 1
        iid = (0xA00 + plane) << 48 | self.host_index(dst) << 32 | via << 16 | 1
        # host_prefix(src)'s network address, without building the network object per path
        return ipaddress.IPv6Address(int(self.mrc_prefix.network_address) | self.host_index(src) << 64 | iid)

    def port_address(self, host: str, plane: int) -> ipaddress.IPv6Address:
        """The host's address on its plane-``plane`` port (outer source of its MRC packets)."""
        return self.link_between(host, self.leaf_name(plane, self.host_leaf(host))).a_addr

    # -- links
    def _make_link(self, a: str, b: str, plane: int, kind: str, ua: int, ub: int) -> Link:
        base = int(self.link_prefix.network_address) | (ua << 80) | (ub << 64)
        prefix = ipaddress.IPv6Network((base, 64))

        def mac(side: int) -> str:
            return f"02:{ua >> 8:02x}:{ua & 0xFF:02x}:{ub >> 8:02x}:{ub & 0xFF:02x}:{side:02x}"

        return Link(a, b, plane, kind, prefix, ipaddress.IPv6Address(base | 1),
                    ipaddress.IPv6Address(base | 2), mac(1), mac(2))

    def links(self) -> list[Link]:
        return list(self._links)

    def link_between(self, x: str, y: str) -> Link:
        n_links = self.planes * (len(self.hosts) + self.leaves * self.spines)
        if "_link_map" in self.__dict__ or n_links <= _DIRECT_LINKS:  # a lookup in the map of all links
            lk = self._link_map.get(frozenset((x, y)))
        else:  # one link, made directly: a host's ports on a large fabric need not build a million links
            lk = self._one_link(x, y)
        if lk is None:
            raise KeyError(f"no link between {x} and {y}")
        return lk

    def _one_link(self, x: str, y: str) -> Link | None:
        """The link x-y as `_links` makes it (equal to its entry there), or None where there is none."""
        nx, ny = self._node_map.get(x), self._node_map.get(y)
        if nx is None or ny is None:
            return None
        rank = {"host": 0, "leaf": 1, "spine": 2}
        a, b = (nx, ny) if rank[nx.kind] < rank[ny.kind] else (ny, nx)
        p = b.plane  # b is a switch: it has a plane
        if p is None:
            return None
        if a.kind == "host" and b.kind == "leaf" and self.hosts[a.index][1] == b.index:
            return self._make_link(a.name, b.name, p, "host-leaf", self.usid(p, ROLE_HOST, a.index),
                                   self.usid(p, ROLE_LEAF, b.index))
        if a.kind == "leaf" and b.kind == "spine" and a.plane == p:
            return self._make_link(a.name, b.name, p, "leaf-spine", self.usid(p, ROLE_LEAF, a.index),
                                   self.usid(p, ROLE_SPINE, b.index))
        return None

    def links_of(self, node: str) -> list[Link]:
        return list(self._links_by_node.get(node, ()))

    # -- paths
    def paths(self, src: str | None = None, dst: str | None = None, plane: int | None = None) -> list[Path]:
        if src is not None and dst is not None:  # one pair: no walk over every host (a host's peers ask)
            if src == dst or src not in self._host_idx or dst not in self._host_idx:
                return []
            planes = range(self.planes) if plane is None else [p for p in (plane,) if 0 <= p < self.planes]
            return [x for p in planes for x in self._paths(src, dst, p)]
        out: list[Path] = []
        for s in self.host_names():
            if src is not None and s != src:
                continue
            for d in self.host_names():
                if d == s or (dst is not None and d != dst):
                    continue
                for p in range(self.planes):
                    if plane is not None and p != plane:
                        continue
                    out += self._paths(s, d, p)
        return out

    def _paths(self, src: str, dst: str, plane: int) -> list[Path]:
        ls, ld = self.host_leaf(src), self.host_leaf(dst)
        lsn, ldn = self.leaf_name(plane, ls), self.leaf_name(plane, ld)
        dport = self.usid(plane, ROLE_HOST, self.host_index(dst))
        if ls == ld:
            usids: tuple[int, ...] = (self.usid(plane, ROLE_LEAF, ls), dport)
            return [Path(src, dst, plane, None, (src, lsn, dst), usids, self.container(usids),
                         self.path_address(src, dst, plane, None))]
        out = []
        for sj in range(self.spines):
            usids = (self.usid(plane, ROLE_LEAF, ls), self.usid(plane, ROLE_SPINE, sj),
                     self.usid(plane, ROLE_LEAF, ld), dport)
            out.append(Path(src, dst, plane, sj, (src, lsn, self.spine_name(plane, sj), ldn, dst), usids,
                            self.container(usids), self.path_address(src, dst, plane, sj)))
        return out

    def path(self, src: str, dst: str, plane: int, spine: int | None) -> Path:
        for p in self.paths(src, dst, plane):
            if p.spine == spine:
                return p
        raise KeyError(f"no path {src}->{dst} plane {plane} spine {spine}")

    def reverse(self, path: Path) -> Path:
        return self.path(path.dst, path.src, path.plane, path.spine)

    def expected_reachable(self, path: Path, down: set[frozenset[str]] | frozenset[frozenset[str]]) -> bool:
        """Whether ``path`` and its reverse (a probe's reply) avoid every link in ``down``."""
        return not any(frozenset(pair) in down for pair in path.links)

    # -- per-link parameters
    def _override(self, a: str, b: str) -> LinkOverride | None:
        for o in self.link_overrides:
            if {o.a, o.b} == {a, b}:
                return o
        return None

    def link_rate_bps(self, a: str, b: str) -> int:
        """The rate of the link a-b: its override's, else the fabric's `link.rate_bps`."""
        o = self._override(a, b)
        return self.link.rate_bps if o is None or o.rate_bps is None else o.rate_bps

    def link_delay_us(self, a: str, b: str) -> int:
        o = self._override(a, b)
        return self.link.delay_us if o is None or o.delay_us is None else o.delay_us

    # -- serialisation (the testbed state file)
    def to_dict(self) -> dict[str, Any]:
        overrides = []
        for o in self.link_overrides:
            d: dict[str, Any] = {"a": o.a, "b": o.b}
            if o.rate_bps is not None:
                d["rate"] = o.rate_bps
            if o.delay_us is not None:
                d["delay"] = o.delay_us
            overrides.append(d)
        return {
            **({"link_override": overrides} if overrides else {}),
            "topology": {"planes": self.planes, "leaves": self.leaves, "spines": self.spines},
            "link": {"rate": self.link.rate_bps, "delay": self.link.delay_us, "mtu": self.link.mtu,
                     "buffer": self.link.buffer_bytes},
            "addressing": {"usid_block": str(self.usid_block), "link_prefix": str(self.link_prefix),
                           "mrc_prefix": str(self.mrc_prefix)},
            "hosts": [{"name": n, "leaf": leaf} for n, leaf in self.hosts],
        }

    def with_link(self, **changes: Any) -> Topology:
        return replace(self, link=replace(self.link, **changes))


# ------------------------------------------------------------------------------------------- loading

_SCHEMA: Final[dict[str, tuple[str, ...]]] = {
    "topology": ("planes", "leaves", "spines"),
    "link": ("rate", "delay", "mtu", "buffer"),
    "addressing": ("usid_block", "link_prefix", "mrc_prefix"),
}
#: The keys a file must give, in the order they are reported (a fixed order: the first missing one is
#: always the same one).
_REQUIRED: Final[dict[str, tuple[str, ...]]] = {"topology": ("planes", "leaves", "spines")}
_ARRAYS: Final = ("hosts", "link_override")
EMPTY_PROBLEM: Final = ("empty topology: needs [topology] with planes, leaves and spines, and two or more "
                        "[[hosts]] tables with name and leaf (docs/testbed.md, \"Topology files\")")

Fail = Callable[[str, str], TopologyError]


def _quantity(fail: Fail, key: str, parse: Callable[[Any], int], value: Any) -> int:
    """One of units' parsers on a file's value; every way it can refuse is the key's problem (a huge
    integer or a thousand-digit string overflows a float before it fails a range)."""
    try:
        return parse(value)
    except (ValueError, OverflowError) as e:
        raise fail(key, str(e)) from None


def _int(fail: Fail, key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(key, f"must be an integer, got {value!r}")
    return value


def from_dict(doc: Mapping[str, Any], source: str = "<dict>") -> Topology:
    """Build a topology from the TOML document's structure; every problem is a `TopologyError` naming
    ``source`` and the key (`load` adds the key's line)."""

    def fail(key: str, problem: str) -> TopologyError:
        return TopologyError(source, key, problem)

    if not doc:
        raise TopologyError(source, None, EMPTY_PROBLEM)
    for key in doc:
        if key not in _SCHEMA and key not in _ARRAYS:
            known = ", ".join([*_SCHEMA, *_ARRAYS])
            raise fail(key, f"unknown key (expected one of: {known})")
    if "topology" not in doc:
        raise fail("topology", "missing table: [topology] with planes, leaves and spines")
    for table, keys in _SCHEMA.items():
        section = doc.get(table, {})
        if not isinstance(section, Mapping):
            raise fail(table, "must be a table")
        for key in section:
            if key not in keys:
                raise fail(f"{table}.{key}", f"unknown key (expected one of: {', '.join(sorted(keys))})")
        for key in _REQUIRED.get(table, ()):
            if key not in section:
                raise fail(f"{table}.{key}", "missing field")

    topo = doc["topology"]
    ints = {key: _int(fail, f"topology.{key}", topo[key]) for key in ("planes", "leaves", "spines")}

    link_doc = doc.get("link", {})
    defaults = LinkParams()
    rate = _quantity(fail, "link.rate", parse_rate, link_doc.get("rate", defaults.rate_bps))
    delay = _quantity(fail, "link.delay", parse_delay_us, link_doc.get("delay", defaults.delay_us))
    buffer = _quantity(fail, "link.buffer", parse_size, link_doc.get("buffer", defaults.buffer_bytes))
    mtu = _int(fail, "link.mtu", link_doc.get("mtu", defaults.mtu))

    addr_doc = doc.get("addressing", {})
    nets: dict[str, ipaddress.IPv6Network] = {}
    for key, default in (("usid_block", "fcbb:bbbb::/32"), ("link_prefix", "fc00::/32"),
                         ("mrc_prefix", "fd00::/48")):
        raw = addr_doc.get(key, default)
        if not isinstance(raw, str):
            raise fail(f"addressing.{key}", f"must be a string such as {default!r}, got {raw!r}")
        try:
            nets[key] = ipaddress.IPv6Network(raw)
        except ValueError as e:
            raise fail(f"addressing.{key}", f"not an IPv6 prefix: {e}") from None
        if nets[key].network_address.scope_id is not None:
            # ipaddress takes fc00::%lo/32, which no route can be installed with (found only at setup)
            raise fail(f"addressing.{key}", f"{raw[:60]!r}: a prefix takes no %scope (e.g. {default!r})")

    hosts_doc = doc.get("hosts")
    if hosts_doc is None:
        raise fail("hosts", "missing: list the hosts as [[hosts]] tables with name and leaf")
    if not isinstance(hosts_doc, list):
        raise fail("hosts", "must be an array of tables ([[hosts]])")
    if len(hosts_doc) > MAX_HOSTS:
        raise fail("hosts", f"need 2..{MAX_HOSTS} hosts, got {len(hosts_doc)}")
    hosts: list[tuple[str, int]] = []
    for i, h in enumerate(hosts_doc):
        if not isinstance(h, Mapping):
            raise fail(f"hosts[{i}]", "must be a table with name and leaf")
        for key in h:
            if key not in ("name", "leaf"):
                raise fail(f"hosts[{i}].{key}", "unknown key (expected name, leaf)")
        for key in ("name", "leaf"):
            if key not in h:
                raise fail(f"hosts[{i}].{key}", "missing field")
        if not isinstance(h["name"], str):
            raise fail(f"hosts[{i}].name", f"must be a string, got {h['name']!r}")
        hosts.append((h["name"], _int(fail, f"hosts[{i}].leaf", h["leaf"])))

    return Topology(
        planes=ints["planes"], leaves=ints["leaves"], spines=ints["spines"], hosts=tuple(hosts),
        link=LinkParams(rate_bps=rate, delay_us=delay, mtu=mtu, buffer_bytes=buffer),
        usid_block=nets["usid_block"], link_prefix=nets["link_prefix"], mrc_prefix=nets["mrc_prefix"],
        link_overrides=_overrides(doc.get("link_override", []), fail), source=source,
    )


def _overrides(raw: Any, fail: Fail) -> tuple[LinkOverride, ...]:
    """``[[link_override]]`` tables: a, b (the link's two nodes), rate and/or delay."""
    if not isinstance(raw, list):
        raise fail("link_override", "must be an array of tables ([[link_override]])")
    out = []
    for i, o in enumerate(raw):
        key = f"link_override[{i}]"
        if not isinstance(o, Mapping):
            raise fail(key, "must be a table with a, b and rate and/or delay")
        for k in o:
            if k not in ("a", "b", "rate", "delay"):
                raise fail(f"{key}.{k}", "unknown key (expected a, b, rate, delay)")
        for k in ("a", "b"):
            if k not in o:
                raise fail(f"{key}.{k}", "missing field")
            if not isinstance(o[k], str):
                raise fail(f"{key}.{k}", f"must be a node name, got {o[k]!r}")
        rate = _quantity(fail, f"{key}.rate", parse_rate, o["rate"]) if "rate" in o else None
        delay = _quantity(fail, f"{key}.delay", parse_delay_us, o["delay"]) if "delay" in o else None
        out.append(LinkOverride(o["a"], o["b"], rate, delay))
    return tuple(out)


def load(path: str | FsPath) -> Topology:
    """Load a topology TOML file. Every error is a `TopologyError` (a ConfigError) that reads
    ``FILE:LINE: key: problem``: the file, the line of the key (or of its table when the key is
    missing), the key and the problem; syntax errors and bytes that are not UTF-8 give their line too."""
    p = FsPath(path)
    text = read_text(p, TopologyError)
    doc = parse_toml(text, str(p), TopologyError)
    try:
        return from_dict(doc, source=str(p))
    except TopologyError as e:
        if e.key is None:
            raise
        raise TopologyError(str(p), e.key, e.problem, key_line(key_lines(text), e.key)) from None


def read_text(path: FsPath, error: type[FileError] = FileError) -> str:
    """A TOML file's text; `error` (``FILE: problem``, ``FILE:LINE: problem`` for bytes that are not
    UTF-8) when it cannot be read or decoded."""
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below)
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise error(str(path), None, "not a regular file")
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise error(str(path), None, f"cannot read: {e.strerror or e}") from None
    if len(data) > MAX_FILE_BYTES:
        raise error(str(path), None, f"larger than {MAX_FILE_BYTES >> 20} MiB: not a configuration file")
    if data.startswith(b"\xef\xbb\xbf"):  # some Windows editors write one: tomllib's error named nothing
        raise error(str(path), None, "starts with a UTF-8 byte-order mark (EF BB BF): save it as UTF-8 "
                    "without one", 1)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise error(str(path), None, f"not UTF-8 text: byte {data[e.start]:#04x} at offset {e.start}"
                    " (TOML files are UTF-8)", line) from None


#: Arrays and inline tables nested deeper than this are refused before tomllib sees them: tomllib recurses
#: once per level, and a few hundred levels exhaust Python's stack (a RecursionError, not a
#: TOMLDecodeError) at a depth that depends on the caller's own stack. No configuration nests more than
#: three or four.
MAX_NESTING: Final = 32
NESTED_TOO_DEEPLY: Final = (f"not valid TOML: nested too deeply (more than {MAX_NESTING} levels of arrays "
                            "and inline tables)")
# what the nesting scan stops at: a multi-line string's delimiter, a quote, a comment, a bracket
_NEST_TOKEN_RE: Final = re.compile(r'"""|' + r"'''|[\"'#\[\]{}]")
_ML_BASIC_END_RE: Final = re.compile(r'(?:[^\\"]|\\.|"(?!""))*"""', re.S)
_BASIC_END_RE: Final = re.compile(r'(?:[^\\"\n]|\\.)*"')
_STRING_OR_COMMENT_RE: Final = re.compile(r'"""(?:[^\\"]|\\.|"(?!""))*"""|' + r"'''.*?'''|"
                                          + r'"(?:[^"\\\n]|\\.)*"|' + r"'[^'\n]*'|#[^\n]*", re.S)
_NOT_BRACKET_RE: Final = re.compile(r"[^\[\]{}]+")
_BRACKET_DELTA: Final = {"[": 1, "{": 1, "]": -1, "}": -1}
_LONG_INT_RE: Final = re.compile(r"(?<![0-9A-Za-z_])[+-]?[0-9](?:_?[0-9]){4300}")


def nesting_line(text: str, limit: int = MAX_NESTING) -> int | None:
    """The line (1-based) where arrays and inline tables first nest deeper than `limit`, else None.
    Strings and comments are skipped (a bracket in them is text); a table header's brackets count too,
    but a header closes on its own line. Lines are counted by newlines only, as TOML counts them.
    First a check at C speed (strings and comments cut out, the deepest point of what is left), then,
    only where that finds too deep a point, the scan token by token that finds its line."""
    if text.count("[") + text.count("{") <= limit:
        return None
    brackets = _NOT_BRACKET_RE.sub("", _STRING_OR_COMMENT_RE.sub("", text))
    if not brackets or max(accumulate(map(_BRACKET_DELTA.__getitem__, brackets))) <= limit:
        return None
    depth, i, n = 0, 0, len(text)
    search = _NEST_TOKEN_RE.search
    while (m := search(text, i)) is not None:
        tok, i = m.group(), m.end()
        if tok == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif tok in ('"""', "'''"):
            if tok == '"""':
                mm = _ML_BASIC_END_RE.match(text, i)
                end = -1 if mm is None else mm.end()
            else:
                end = text.find(tok, i)
                end = -1 if end < 0 else end + 3
            if end < 0:
                return None  # unterminated: tomllib says where
            i = end
            while i < n and text[i] == tok[0] and i - end < 2:  # """" and """"": the string ends in quotes
                i += 1
        elif tok == '"':
            mm = _BASIC_END_RE.match(text, i)
            if mm is not None:
                i = mm.end()
        elif tok == "'":
            end, nl = text.find("'", i), text.find("\n", i)
            if end >= 0 and (nl < 0 or end < nl):
                i = end + 1
        elif tok in "[{":
            depth += 1
            if depth > limit:
                return text.count("\n", 0, m.start()) + 1
        else:
            depth = max(depth - 1, 0)
    return None


def parse_toml(text: str, source: str, error: type[FileError] = FileError) -> dict[str, Any]:
    """tomllib's document, or `error` ``FILE:LINE: not valid TOML: ... (column C)``; arrays or inline
    tables nested deeper than `MAX_NESTING` are ``FILE:LINE: not valid TOML: nested too deeply (...)``."""
    if (line := nesting_line(text)) is not None:
        raise error(source, None, NESTED_TOO_DEEPLY, line)
    try:
        return tomllib.loads(text)
    except RecursionError:  # the scan above refuses what would recurse this deep; no traceback either way
        raise error(source, None, NESTED_TOO_DEEPLY, nesting_line(text, 1)) from None
    except tomllib.TOMLDecodeError as e:
        msg = str(e)
        m = re.search(r" \(at line (\d+), column (\d+)\)$", msg)
        if m is None:
            raise error(source, None, f"not valid TOML: {msg}") from None
        raise error(source, None, f"not valid TOML: {msg[:m.start()]} (column {m.group(2)})",
                    int(m.group(1))) from None
    except ValueError as e:  # int() of a decimal integer beyond Python's 4300-digit limit, inside tomllib
        m = _LONG_INT_RE.search(text)
        line = None if m is None else text.count("\n", 0, m.start()) + 1
        problem = "an integer of more than 4300 digits" if m is not None else str(e)
        raise error(source, None, f"not valid TOML: {problem}", line) from None


def key_line(lines: Mapping[str, int], key: str) -> int | None:
    """The line of ``key`` (``hosts[1].leaf``), else of the nearest enclosing table or entry that the
    file writes (``hosts[1]``, then ``hosts``): a missing field is reported at its table's header."""
    k = key
    while True:
        if k in lines:
            return lines[k]
        cut = max(k.rfind("."), k.rfind("["))
        if cut <= 0:
            return None
        k = k[:cut]


_KEY_PART: Final = r'(?:[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"|\'[^\']*\')'
_KEY_RE: Final = re.compile(rf"[ \t]*({_KEY_PART}(?:[ \t]*\.[ \t]*{_KEY_PART})*)[ \t]*=")
_HEADER_RE: Final = re.compile(rf"[ \t]*(\[\[?)[ \t]*({_KEY_PART}(?:[ \t]*\.[ \t]*{_KEY_PART})*)[ \t]*\]")


def _dotted(raw: str) -> str:
    """A TOML key as the error messages spell it: parts joined by dots, quotes and blanks gone."""
    parts = re.findall(_KEY_PART, raw)
    return ".".join(p[1:-1] if p[:1] in "\"'" else p for p in parts)


def _in_arrays(name: str, counts: Mapping[str, int]) -> str:
    """A header's dotted name with each enclosing array of tables replaced by its current entry
    (``peer.plane`` -> ``peer[1].plane`` once two ``[[peer]]`` were seen); the last part stays as is."""
    parts = name.split(".")
    out = ""
    for part in parts[:-1]:
        out = f"{out}.{part}" if out else part
        if out in counts:
            out = f"{out}[{counts[out] - 1}]"
    return f"{out}.{parts[-1]}" if out else parts[-1]


class _ValueScan:
    """Where a value that may span lines stands: the multi-line string still open, the brackets still
    open and, for an array, how many entries began (each entry's first line is recorded as ``key[i]``,
    so that an error in the third table of a multi-line inline array names the line that holds it)."""

    __slots__ = ("array", "delim", "depth", "entries", "expect", "key")

    def __init__(self, key: str) -> None:
        self.key = key
        self.delim: str | None = None
        self.depth = 0
        self.array = False
        self.entries = 0
        self.expect = False

    @property
    def open(self) -> bool:
        return self.delim is not None or self.depth > 0

    def feed(self, s: str, n: int, lines: dict[str, int]) -> None:
        """Scan `s`, line `n` of the value (or the rest of the key's line)."""
        i, size = 0, len(s)
        while i < size:
            if self.delim is not None:
                if self.delim == '"""':
                    mm = _ML_BASIC_END_RE.match(s, i)
                    end = -1 if mm is None else mm.end()
                else:
                    end = s.find("'''", i)
                    end = -1 if end < 0 else end + 3
                if end < 0:
                    return
                i = end
                while i < size and s[i] == self.delim[0] and i - end < 2:
                    i += 1
                self.delim = None
                continue
            c = s[i]
            if c in " \t\r":
                i += 1
                continue
            if c == "#":
                return
            if self.array and self.depth == 1 and self.expect and c not in "],":
                lines.setdefault(f"{self.key}[{self.entries}]", n)
                self.entries += 1
                self.expect = False
            if s.startswith(('"""', "'''"), i):
                self.delim = s[i:i + 3]
                i += 3
                continue
            if c == '"':
                mm = _BASIC_END_RE.match(s, i + 1)
                i = size if mm is None else mm.end()
                continue
            if c == "'":
                end = s.find("'", i + 1)
                i = size if end < 0 else end + 1
                continue
            if c in "[{":
                if self.depth == 0 and c == "[":
                    self.array = self.expect = True
                self.depth += 1
            elif c in "]}":
                self.depth = max(self.depth - 1, 0)
            elif c == "," and self.depth == 1:
                self.expect = True
            i += 1


def _with_prefixes(lines: dict[str, int], name: str, n: int) -> None:
    """Record `name` and each table it implies (``engin.x`` implies ``engin``) at line `n`, unless an
    earlier line has them: an error about an unknown table written only as ``[engin.x]`` gets a line."""
    parts = name.split(".")
    for j in range(1, len(parts) + 1):
        lines.setdefault(".".join(parts[:j]), n)


def key_lines(text: str) -> dict[str, int]:
    """Line numbers (1-based) of a TOML document's tables and keys, spelt as the errors spell them:
    ``topology``, ``topology.planes``, ``hosts`` (its first header), ``hosts[1]``, ``hosts[1].leaf``;
    a table under an entry of an array of tables is spelt under that entry (``[[peer.plane]]`` after the
    second ``[[peer]]``: ``peer[1].plane[0]``, its keys ``peer[1].plane[0].address``); the entries of an
    array value are ``key[i]`` at the line where each begins; a dotted header or key also gives the
    tables it implies (``[engin.x]``: ``engin``).
    tomllib gives positions for syntax errors only; this scan of the (already valid) text gives them to
    the semantic ones. Lines are split at "\\n" only, as TOML counts them (U+2028 or U+0085 in a comment
    is no line break). Lines inside multi-line strings and arrays are not headers or keys; a key
    written twice would have failed to parse, so the first line of each is its only line."""
    lines: dict[str, int] = {}
    counts: dict[str, int] = {}
    table = ""
    scan: _ValueScan | None = None
    for n, line in enumerate(text.split("\n"), start=1):
        if scan is not None and scan.open:
            scan.feed(line, n, lines)
            continue
        if m := _HEADER_RE.match(line):
            name = _in_arrays(_dotted(m.group(2)), counts)
            if m.group(1) == "[[":
                i = counts.get(name, 0)
                counts[name] = i + 1
                _with_prefixes(lines, name, n)
                table = f"{name}[{i}]"
            else:
                table = name
            _with_prefixes(lines, table, n)
        elif m := _KEY_RE.match(line):
            key = f"{table}.{_dotted(m.group(1))}" if table else _dotted(m.group(1))
            _with_prefixes(lines, key, n)
            scan = _ValueScan(key)
            scan.feed(line[m.end():], n, lines)
    return lines


def default_topology_dir() -> FsPath:
    """The example topology files: ``deploy/topologies`` of the checkout, shipped as the package data of
    `mrc._topologies` (so an installed wheel has them too)."""
    return FsPath(str(resources.files("mrc._topologies")))


def example_path(path: str | FsPath, sub: str = "", base: FsPath | None = None) -> FsPath:
    """`path` (relative to `base` when given) when it exists; else, for a bare file name, the shipped
    example of that name (in `default_topology_dir()`, or its folder `sub`), so that ``small.toml`` or
    ``cluster-8k.toml`` work from any directory and from an installed wheel; else `path` as given (its
    loader says it cannot read it). os.path's tests: False, not OSError, for a name the system refuses
    (too long), which the loader then reports as the file error it is."""
    given = FsPath(path)
    if base is not None and not given.is_absolute():
        given = base / given
    if os.path.exists(given) or FsPath(path).name != str(path):
        return given
    shipped = default_topology_dir() / sub / FsPath(path).name
    return shipped if os.path.isfile(shipped) else given


def generate(
    planes: int,
    leaves: int,
    spines: int,
    hosts_per_leaf: int,
    *,
    link: LinkParams | None = None,
    source: str | None = None,
) -> Topology:
    """A generated fabric: ``planes`` × (``leaves`` leaves, ``spines`` spines), ``hosts_per_leaf`` hosts
    on every leaf, named ``h0``, ``h1``, ... leaf by leaf (host i sits on leaf i // hosts_per_leaf)."""
    if hosts_per_leaf < 1:
        raise TopologyError(source or "<generated>", "hosts_per_leaf", "must be at least 1")
    hosts = tuple((f"h{i}", i // hosts_per_leaf) for i in range(leaves * hosts_per_leaf))
    return Topology(
        planes=planes, leaves=leaves, spines=spines, hosts=hosts, link=link or LinkParams(),
        source=source or f"<generated {planes}x{leaves}x{spines}x{hosts_per_leaf}>",
    )
