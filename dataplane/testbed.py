"""The multi-plane SRv6 testbed in network namespaces (docs/design.md §6), built with pyroute2 only.

One namespace per node, named ``<testbed>-<node>`` (``mrc-h0``, ``mrc-p2s1``); one veth pair per link.
Inside a namespace an interface is named after the node it faces (``p0l0`` in host h0, ``h0`` in leaf
p0l0), so names stay short (≤ 15 characters) and identical across testbeds, while the namespace prefix
keeps two testbeds apart. Switches forward by kernel SRv6 only: ``seg6local End`` with the NEXT-C-SID
flavor on their /48 plus static routes to their neighbours' /48s. Hosts decapsulate with ``End.DT6``
(table 255) on their per-plane /48 and encapsulate with ``seg6 encap.red`` routes (one uSID container,
so the wire format is plain IPv6-in-IPv6 as in docs/design.md §3):

* ``MRC(dst)/128`` -> the default path (plane 0, first spine);
* ``MRC(dst)/128 from PATH-ADDRESS/128`` -> that path, for every path the host sources;
* ``PATH-ADDRESS/128`` of every path that ends at this host -> the reverse path (replies go back the way
  the probe came, so a path is reachable exactly when its links are up).

Every fabric port has a TBF root qdisc (rate, burst, queue limit = the link's buffer plus the slack of
`tbf_limit`) in its egress direction; both ends of a link together limit both directions. The switch
ports' buffer itself is the eBPF virtual queue's (``switch_port``: ECN, trimming and drops by `buffer`,
counted per reason); the TBF only serialises at the rate.

A state file ``/run/mrc/testbed/<name>.json`` (``$MRC_RUN_DIR``) is written before anything is built, so
``down`` and ``show`` work from any process, and a half-built testbed can always be removed.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import select
import socket
import struct
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from mrc.errors import MrcError
from mrc.topology import MIN_RATE_BPS, Link, Topology, format_rate, from_dict

from . import netns, seg6

DEFAULT_NAME: Final = "mrc"
_NAME_RE: Final = re.compile(r"^[a-z][a-z0-9]{0,11}\Z")
IFA_F_NODAD: Final = 0x02
NUD_PERMANENT: Final = 0x80
TBF_HANDLE: Final = 0x10000  # 1:
ETH_HLEN: Final = 14

Progress = Callable[[str], None]


def run_dir() -> Path:
    return Path(os.environ.get("MRC_RUN_DIR", "/run/mrc")) / "testbed"


def _link_key(a: str, b: str) -> str:
    return "~".join(sorted((a, b)))


def tbf_burst(rate_bps: int, mtu: int) -> int:
    """Bucket size: one millisecond at the line rate, and never less than two full frames (TBF drops a
    packet larger than its bucket)."""
    return max(rate_bps // 8 // 1000, 2 * (mtu + ETH_HLEN))


#: how long a port's TBF may fall behind its line rate without dropping (`tbf_limit`)
TBF_STALL_NS: Final = 50_000_000
#: the most that slack adds to a queue limit
TBF_STALL_MAX_BYTES: Final = 32 << 20


def tbf_limit(rate_bps: int, buffer_bytes: int) -> int:
    """A TBF's queue limit: the link's buffer plus what the port sends in TBF_STALL_NS (at most
    TBF_STALL_MAX_BYTES). Why more than the buffer: the buffer is modelled by switch_port's virtual queue,
    which drains at the line rate by the clock; the TBF drains only when the kernel gets to it, from the
    qdisc watchdog's softirq, which on a busy 2-CPU host waits behind the mrcds (nice -10) for up to
    ~10 ms. With the limit equal to the buffer, such a stall overflowed the TBF while the virtual queue
    still held two packets: drops that no switch counter saw, that trimming was configured to prevent
    (measured: 83 TBF drops on the four h2 ports in 3 incasts of test_daemon.py, trimming at 16 KiB, and
    an ACK timeout in 1 of 3; none in the switches' drop_buffer counters). A host stall now costs
    latency, which the congestion control sees, and the drops are the virtual queue's, counted."""
    return buffer_bytes + min(rate_bps * TBF_STALL_NS // 8_000_000_000, TBF_STALL_MAX_BYTES)


@dataclass
class LinkState:
    up: bool
    rate_bps: int

    def to_dict(self) -> dict[str, Any]:
        return {"up": self.up, "rate": self.rate_bps}


@dataclass
class Testbed:
    """A built (or half-built) testbed, as recorded in its state file."""

    name: str
    topo: Topology
    source: str
    links: dict[str, LinkState] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    build_seconds: float | None = None
    complete: bool = False

    # -- names
    def ns(self, node: str) -> str:
        return f"{self.name}-{node}"

    def namespaces(self) -> list[str]:
        return [self.ns(n.name) for n in self.topo.nodes()]

    def link(self, x: str, y: str) -> Link:
        try:
            return self.topo.link_between(x, y)
        except KeyError:
            raise MrcError(f"testbed {self.name}: no link between {x} and {y}") from None

    def link_state(self, link: Link) -> LinkState:
        return self.links[_link_key(link.a, link.b)]

    def down_links(self) -> frozenset[frozenset[str]]:
        return frozenset(frozenset(k.split("~")) for k, s in self.links.items() if not s.up)

    # -- state file
    @staticmethod
    def path_for(name: str) -> Path:
        return run_dir() / f"{name}.json"

    def save(self) -> None:
        d = run_dir()
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o755)
        doc = {
            "name": self.name, "source": self.source, "created": self.created,
            "build_seconds": self.build_seconds, "complete": self.complete,
            "topology": self.topo.to_dict(),
            "links": {k: v.to_dict() for k, v in sorted(self.links.items())},
        }
        tmp = self.path_for(self.name).with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1) + "\n")
        tmp.replace(self.path_for(self.name))

    @classmethod
    def load(cls, name: str) -> Testbed:
        check_name(name)  # a name is a file name under the run directory: '../x' must not reach others
        p = cls.path_for(name)
        try:
            doc = json.loads(p.read_text())
        except FileNotFoundError:
            raise MrcError(f"no testbed named {name!r} (no {p}); "
                           "bring one up with 'mrcctl testbed up'") from None
        except RecursionError:  # a damaged file nested deeper than the parser goes
            raise MrcError(f"{p}: unreadable testbed state: nested too deeply") from None
        except (OSError, ValueError) as e:
            raise MrcError(f"{p}: unreadable testbed state: {e}") from None
        try:
            if not isinstance(doc, dict):
                raise ValueError(f"a JSON {type(doc).__name__} where an object belongs")
            topo = from_dict(doc["topology"], source=str(p))
            links = {k: LinkState(bool(v["up"]), int(v["rate"])) for k, v in doc["links"].items()}
            return cls(name=doc["name"], topo=topo, source=doc.get("source", "?"), links=links,
                       created=doc.get("created", 0.0), build_seconds=doc.get("build_seconds"),
                       complete=bool(doc.get("complete")))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            # written by `testbed up` and read back: only a damaged or foreign file gets here
            what = f"missing {e}" if isinstance(e, KeyError) else str(e)
            raise MrcError(f"{p}: damaged testbed state ({what}); 'mrcctl testbed down --name {name}' "
                           "removes what the record names, or remove the file") from None


def names() -> list[str]:
    d = run_dir()
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def resolve_name(name: str | None) -> str:
    """The testbed a command means: the one named, or the only one that exists."""
    if name is not None:
        return name
    existing = names()
    if not existing:
        raise MrcError("no testbed is up; bring one up with 'mrcctl testbed up'")
    if len(existing) > 1:
        raise MrcError(f"several testbeds are up ({', '.join(existing)}); name one with --name")
    return existing[0]


def check_name(name: str) -> None:
    if not _NAME_RE.match(name):
        raise MrcError(f"testbed name {name!r}: use a lowercase letter then up to 11 letters/digits")


# ------------------------------------------------------------------------------------------ building


class _Sockets:
    """One pyroute2 IPRoute per namespace, closed together."""

    def __init__(self, tb: Testbed) -> None:
        self.tb = tb
        self._s: dict[str, Any] = {}

    def __getitem__(self, node: str) -> Any:
        if node not in self._s:
            self._s[node] = netns.ipr(self.tb.ns(node))
        return self._s[node]

    def ifindex(self, node: str, ifname: str) -> int:
        found = self[node].link_lookup(ifname=ifname)
        if not found:
            raise MrcError(f"testbed {self.tb.name}: {ifname} missing in {self.tb.ns(node)}")
        return int(found[0])

    def close(self) -> None:
        for s in self._s.values():
            with contextlib.suppress(Exception):
                s.close()
        self._s.clear()


@contextlib.contextmanager
def _sockets(tb: Testbed) -> Iterator[_Sockets]:
    s = _Sockets(tb)
    try:
        yield s
    finally:
        s.close()


_COMMON_SYSCTLS: Final[dict[str, str | int]] = {
    # no DAD (addresses usable at once), no RA/RS, no link-local addresses: neighbours are permanent
    # entries, so the fabric carries no ND/MLD noise; addresses survive a link going down.
    "net.ipv6.conf.all.accept_dad": 0,
    "net.ipv6.conf.default.accept_dad": 0,
    "net.ipv6.conf.all.accept_ra": 0,
    "net.ipv6.conf.default.accept_ra": 0,
    "net.ipv6.conf.default.router_solicitations": 0,
    "net.ipv6.conf.default.addr_gen_mode": 1,
    "net.ipv6.conf.all.keep_addr_on_down": 1,
    "net.ipv6.conf.default.keep_addr_on_down": 1,
}
_SWITCH_SYSCTLS: Final[dict[str, str | int]] = {"net.ipv6.conf.all.forwarding": 1}


_SRV6_GAP: list[str | None] = []  # the probe's answer, once per process


def srv6_gap() -> str | None:
    """Why this kernel cannot forward the testbed's SRv6 (None: it can). Probed once per process in a
    throwaway namespace: a ``seg6 encap.red`` route (the hosts' encapsulation) and a ``seg6local End``
    route with the NEXT-C-SID flavor (the switches' forwarding). A kernel built without
    CONFIG_IPV6_SEG6_LWTUNNEL answers EOPNOTSUPP to both ("lwt encapsulation type not supported"); one
    older than 6.1 knows no NEXT-C-SID. Building the testbed there would fail half-way with a bare
    netlink error; this names what is missing instead."""
    if _SRV6_GAP:
        return _SRV6_GAP[0]
    from pyroute2.netlink.exceptions import NetlinkError

    name = f"mrcprobe-{os.getpid()}-{secrets.token_hex(3)}"
    gap: str | None = None
    try:
        netns.create(name)
    except OSError as e:
        gap = f"no network namespace could be made to probe the kernel's SRv6 ({e}): the testbed needs them"
        _SRV6_GAP.append(gap)
        return gap
    try:
        ipr = netns.ipr(name)
        try:
            lo = int(ipr.link_lookup(ifname="lo")[0])
            ipr.link("set", index=lo, state="up")
            steps = (
                ("seg6 encapsulation routes (hosts)",
                 seg6.seg6_encap_msg("fd00:1::", 64, ["fcbb:bbbb:100::"], oif=lo)),
                ("seg6local End with the NEXT-C-SID flavor (switches)",
                 seg6.seg6local_msg("fcbb:bbbb:100::", 48, lo, "End", local=True,
                                    flavors={"operations": ["next-csid"], "lblen": 32, "nflen": 16})),
            )
            for what, msg in steps:
                try:
                    seg6.route_request(ipr, msg)
                except NetlinkError as e:
                    if what.startswith("seg6 ") and e.code == errno.EOPNOTSUPP:
                        gap = ("this kernel has no SRv6 routes (built without CONFIG_IPV6_SEG6_LWTUNNEL: "
                               f"{e}); the testbed's hosts encapsulate with seg6 routes and its switches "
                               "forward with seg6local End NEXT-C-SID: use a kernel built with IPv6 SRv6 "
                               "(Debian's and most distributions' are, 6.1 or newer)")
                    else:
                        gap = (f"this kernel refused {what} ({e}): the testbed needs IPv6 SRv6 with "
                               "NEXT-C-SID (Linux 6.1 or newer, CONFIG_IPV6_SEG6_LWTUNNEL)")
                    break
        finally:
            ipr.close()
    finally:
        netns.remove(name)
    _SRV6_GAP.append(gap)
    return gap


def up(topo: Topology, name: str = DEFAULT_NAME, source: str = "<model>",
       progress: Progress | None = None) -> Testbed:
    """Build ``topo`` as testbed ``name``. On any failure everything built so far is removed again."""
    check_name(name)
    say = progress or (lambda _m: None)
    if topo.link.delay_us:
        raise MrcError(f"{topo.source}: link.delay: {topo.link.delay_us} us requested, but link delay needs "
                       "netem or fq (EDT) and this kernel has neither; use delay = 0")
    check_rate(topo.link.rate_bps)
    for i, o in enumerate(topo.link_overrides):
        if o.delay_us:
            raise MrcError(f"{topo.source}: link_override[{i}].delay: {o.delay_us} us requested, but link "
                           "delay needs netem or fq (EDT) and this kernel has neither")
        if o.rate_bps is not None:
            check_rate(o.rate_bps)
    if os.geteuid() != 0:
        raise MrcError("building a testbed needs root (network namespaces)")
    gap = srv6_gap()
    if gap is not None:
        raise MrcError(f"cannot build testbed {name!r}: {gap}")
    tb = Testbed(name=name, topo=topo, source=source,
                 links={_link_key(lk.a, lk.b): LinkState(True, topo.link_rate_bps(lk.a, lk.b))
                        for lk in topo.links()})
    clash = [n for n in tb.namespaces() if netns.exists(n)]
    if Testbed.path_for(name).exists() or clash:
        raise MrcError(f"testbed {name!r} already exists; remove it with 'mrcctl testbed down --name {name}'")
    t0 = time.monotonic()
    tb.save()  # first: a crash half-way leaves a record that `down` can clean up
    try:
        _build(tb, say)
    except BaseException:
        say(f"build failed: removing testbed {name}")
        teardown(name)
        raise
    tb.build_seconds = round(time.monotonic() - t0, 3)
    tb.complete = True
    tb.save()
    return tb


def _build(tb: Testbed, say: Progress) -> None:
    topo = tb.topo
    nodes = topo.nodes()
    say(f"creating {len(nodes)} namespaces ({tb.ns('*')})")
    for n in nodes:
        netns.create(tb.ns(n.name))
        netns.set_sysctls(tb.ns(n.name), {**_COMMON_SYSCTLS, **({} if n.is_host else _SWITCH_SYSCTLS)})
    with _sockets(tb) as s:
        for n in nodes:
            s[n.name].link("set", index=s.ifindex(n.name, "lo"), state="up")
        links = topo.links()
        say(f"creating {len(links)} links (veth, mtu {topo.link.mtu}, tbf {format_rate(topo.link.rate_bps)})")
        for lk in links:
            _add_link(tb, s, lk)
        say("installing neighbours, micro-SIDs and SRv6 routes")
        for n in nodes:
            _configure_node(tb, s, n.name)


def _add_link(tb: Testbed, s: _Sockets, lk: Link) -> None:
    mtu = tb.topo.link.mtu
    s[lk.a].link("add", ifname=lk.a_ifname, kind="veth", address=lk.a_mac, mtu=mtu,
                 peer={"ifname": lk.b_ifname, "net_ns_fd": str(netns.NETNS_RUN_DIR / tb.ns(lk.b)),
                       "address": lk.b_mac, "mtu": mtu})
    for node, ifname, addr, _mac in lk.ends():
        idx = s.ifindex(node, ifname)
        s[node].addr("add", index=idx, address=str(addr), prefixlen=64, flags=IFA_F_NODAD)
        _set_tbf(s, node, idx, tb.link_state(lk).rate_bps, tb.topo.link.mtu, tb.topo.link.buffer_bytes)
        s[node].link("set", index=idx, state="up")


MAX_TBF_RATE_BPS: Final = (2**32 - 1) * 8  # TCA_TBF_PARMS carries bytes/s in 32 bits (no RATE64 here)


def check_rate(rate_bps: int) -> None:
    """The TBF rates a link can be set to: from the topology files' floor (below ~1 kbit/s the burst of a
    jumbo frame is more time than TBF's 32-bit tick fields hold: pyroute2 raised struct.error) to what
    32-bit bytes/s carry."""
    if not MIN_RATE_BPS <= rate_bps <= MAX_TBF_RATE_BPS:
        raise MrcError(f"link rate {format_rate(rate_bps)}: the TBF limit must be "
                       f"{format_rate(MIN_RATE_BPS)} .. {MAX_TBF_RATE_BPS / 1e9:.1f} Gbit/s (32-bit "
                       "bytes/s without TCA_TBF_RATE64)")


def _set_tbf(s: _Sockets, node: str, idx: int, rate_bps: int, mtu: int, buffer_bytes: int) -> None:
    s[node].tc("replace", "tbf", idx, TBF_HANDLE, rate=f"{rate_bps}bit", burst=tbf_burst(rate_bps, mtu),
               limit=tbf_limit(rate_bps, buffer_bytes))


def _neigh(s: _Sockets, node: str, idx: int, addr: str, mac: str) -> None:
    s[node].neigh("replace", dst=addr, lladdr=mac, ifindex=idx, state=NUD_PERMANENT, family=socket.AF_INET6)


def _route(s: _Sockets, node: str, **kw: Any) -> None:
    s[node].route("replace", family=socket.AF_INET6, proto=seg6.RTPROT_STATIC, **kw)


def _configure_node(tb: Testbed, s: _Sockets, node: str) -> None:
    """Neighbours and routes of one node; idempotent (replace), so `link up` can re-apply it."""
    topo = tb.topo
    n = topo.node(node)
    ipr = s[node]
    # neighbours (permanent) on every port
    for lk in topo.links_of(node):
        mine, other = lk.ends() if lk.a == node else lk.ends()[::-1]
        _neigh(s, node, s.ifindex(node, mine[1]), str(other[2]), other[3])
    if n.is_host:
        _configure_host(tb, s, node)
        return
    # switch: End with NEXT-C-SID on its own /48, static routes to each neighbour's /48
    # the End SID is a local route on the loopback, so it survives any one port going down
    ports = topo.links_of(node)
    own = topo.usid_prefix(node)
    seg6.route_request(ipr, seg6.seg6local_msg(
        str(own.network_address), 48, s.ifindex(node, "lo"), "End",
        flavors={"operations": ["next-csid"], "lblen": 32, "nflen": 16}, local=True,
    ), replace=True)
    for lk in ports:
        peer, ifname, gw = (lk.b, lk.a_ifname, lk.b_addr) if lk.a == node else (lk.a, lk.b_ifname, lk.a_addr)
        plane = lk.plane if topo.node(peer).is_host else None
        pfx = topo.usid_prefix(peer, plane)
        _route(s, node, dst=str(pfx), gateway=str(gw), oif=s.ifindex(node, ifname))


def _configure_host(tb: Testbed, s: _Sockets, host: str) -> None:
    topo = tb.topo
    ipr = s[host]
    lo = s.ifindex(host, "lo")
    addrs = [topo.mrc_address(host)] + [p.path_address for p in topo.paths(src=host)]
    for a in addrs:
        with contextlib.suppress(Exception):  # re-applying: the address may exist already
            ipr.addr("add", index=lo, address=str(a), prefixlen=128, flags=IFA_F_NODAD)
    port: dict[int, tuple[int, str]] = {}
    for p in range(topo.planes):
        leaf = topo.leaf_name(p, topo.host_leaf(host))
        lk = topo.link_between(host, leaf)
        idx = s.ifindex(host, lk.a_ifname)
        port[p] = (idx, str(lk.b_addr))
        # the plane's leaf /48 is reached through this port; the host's own /48 decapsulates
        _route(s, host, dst=str(topo.usid_prefix(leaf)), gateway=str(lk.b_addr), oif=idx)
        mine = topo.usid_prefix(host, p)
        seg6.route_request(ipr, seg6.seg6local_msg(str(mine.network_address), 48, lo, "End.DT6", table=255,
                                                   local=True), replace=True)

    def encap(dst: str, path_plane: int, container: str, src: str | None = None) -> None:
        idx, gw = port[path_plane]
        seg6.route_request(ipr, seg6.seg6_encap_msg(dst, 128, [container], mode="encap.red", oif=idx,
                                                     gateway=gw,
                                                     src=src), replace=True)

    for peer in topo.host_names():
        if peer == host:
            continue
        default = topo.paths(host, peer, 0)[0]
        encap(str(topo.mrc_address(peer)), 0, str(default.container))
    for path in topo.paths(src=host):
        encap(str(topo.mrc_address(path.dst)), path.plane, str(path.container), src=str(path.path_address))
    for path in topo.paths(dst=host):
        back = topo.reverse(path)
        encap(str(path.path_address), path.plane, str(back.container))


# ------------------------------------------------------------------------------------------ teardown


def teardown(name: str) -> dict[str, Any]:
    """Remove testbed ``name``: processes in its namespaces, the namespaces (and with them every link,
    route and qdisc), and the state file. Works on half-built testbeds and without a state file."""
    prefix = f"{name}-"
    spaces = set()
    with contextlib.suppress(MrcError, KeyError):
        spaces.update(Testbed.load(name).namespaces())
    spaces.update(n for n in netns.listing() if n.startswith(prefix) and _is_ours(n, name))
    spaces = {n for n in spaces if netns.exists(n)}
    killed = netns.kill_processes(sorted(spaces))
    for n in sorted(spaces):
        netns.remove(n)
    with contextlib.suppress(FileNotFoundError):
        Testbed.path_for(name).unlink()
    return {"name": name, "namespaces_removed": len(spaces), "processes_killed": len(killed)}


def _is_ours(ns_name: str, tb_name: str) -> bool:
    """Only namespaces shaped like ours (<tb>-<host> or <tb>-p<N>l<N>/s<N>) are removed by prefix."""
    rest = ns_name[len(tb_name) + 1:]
    return bool(re.fullmatch(r"p\d+[ls]\d+|[a-z][a-z0-9]{0,7}", rest))


# ------------------------------------------------------------------------------------------ operations


def set_link(name: str, x: str, y: str, *, up: bool | None = None, rate_bps: int | None = None,
             delay_us: int | None = None) -> Testbed:
    """Take a link down / bring it up / change its rate, on the running testbed, and record it.

    Down: the upper end (leaf or spine) is set administratively down, so the lower end loses carrier:
    packets into the link are dropped in both directions and the upper node's routes over it are gone
    (no silent fallback to another path). Up: the end comes back and its node's routes are re-applied."""
    tb = Testbed.load(name)
    lk = tb.link(x, y)
    if delay_us:
        raise MrcError("link delay needs netem or fq (EDT), which this kernel lacks; only rate can change")
    st = tb.link_state(lk)
    if rate_bps is not None:
        check_rate(rate_bps)
    with _sockets(tb) as s:
        if rate_bps is not None:
            for node, ifname, _addr, _mac in lk.ends():
                _set_tbf(s, node, s.ifindex(node, ifname), rate_bps, tb.topo.link.mtu,
                         tb.topo.link.buffer_bytes)
            st.rate_bps = rate_bps
        if up is not None:
            idx = s.ifindex(lk.b, lk.b_ifname)
            s[lk.b].link("set", index=idx, state="up" if up else "down")
            if up:
                _configure_node(tb, s, lk.b)
            st.up = up
    tb.save()
    return tb


def _oper(msg: Any) -> str:
    return str(msg.get_attr("IFLA_OPERSTATE") or "UNKNOWN")


def show(name: str) -> dict[str, Any]:
    """The testbed as the kernel has it now: nodes, links (state, measured config), addresses, micro-SIDs."""
    tb = Testbed.load(name)
    topo = tb.topo
    nodes = []
    for n in topo.nodes():
        entry: dict[str, Any] = {"name": n.name, "kind": n.kind, "namespace": tb.ns(n.name),
                                 "present": netns.exists(tb.ns(n.name))}
        if n.is_host:
            entry["plane"] = None
            entry["mrc_address"] = str(topo.mrc_address(n.name))
            entry["leaf"] = topo.host_leaf(n.name)
            entry["ports"] = [{"plane": p, "address": str(topo.port_address(n.name, p)),
                               "usid": f"{topo.node_usid(n.name, p):04x}",
                               "sid": str(topo.usid_prefix(n.name, p))} for p in range(topo.planes)]
        else:
            entry["plane"] = n.plane
            entry["usid"] = f"{topo.node_usid(n.name):04x}"
            entry["sid"] = str(topo.usid_prefix(n.name))
        nodes.append(entry)
    links = []
    with _sockets(tb) as s:
        for lk in topo.links():
            st = tb.link_state(lk)
            states = []
            rates: list[int | None] = []
            drops: list[int | None] = []
            for node, ifname, _a, _m in lk.ends():
                try:
                    idx = s.ifindex(node, ifname)
                    states.append(_oper(s[node].get_links(idx)[0]))
                    rate, dropped = _tbf_state(s[node], idx)
                except Exception:
                    states.append("MISSING")
                    rate = dropped = None
                rates.append(rate)
                drops.append(dropped)
            links.append({
                "a": lk.a, "b": lk.b, "plane": lk.plane, "kind": lk.kind,
                "a_ifname": lk.a_ifname, "b_ifname": lk.b_ifname,
                "a_address": str(lk.a_addr), "b_address": str(lk.b_addr),
                "state": "up" if st.up else "down", "oper": states,
                "rate": st.rate_bps, "rate_kernel": rates, "tbf_dropped": drops,
            })
    return {"name": tb.name, "source": tb.source, "complete": tb.complete, "build_seconds": tb.build_seconds,
            "planes": topo.planes, "leaves": topo.leaves, "spines": topo.spines,
            "mtu": topo.link.mtu, "buffer": topo.link.buffer_bytes,
            "usid_block": str(topo.usid_block), "nodes": nodes, "links": links}


def _tbf_state(ipr: Any, idx: int) -> tuple[int | None, int | None]:
    """The port's TBF as the kernel has it: (rate in bit/s, packets it dropped), None where unknown.
    A TBF drop is one the switch's virtual queue did not make (`tbf_limit`): none is expected."""
    for q in ipr.get_qdiscs(idx):
        if q.get_attr("TCA_KIND") == "tbf":
            opts = q.get_attr("TCA_OPTIONS")
            parms = opts.get_attr("TCA_TBF_PARMS") if opts is not None else None
            st = q.get_attr("TCA_STATS")
            return (None if parms is None else int(parms["rate"]) * 8,
                    None if st is None else int(st["drop"]))
    return None, None


def routes(name: str, node: str) -> list[dict[str, Any]]:
    """The IPv6 routes of one node, with seg6/seg6local encaps decoded (flavors included)."""
    tb = Testbed.load(name)
    with _sockets(tb) as s:
        ipr = s[node]
        seg6.use_srv6_messages(ipr)
        out = []
        for r in ipr.route("dump", family=socket.AF_INET6):
            if r.get_attr("RTA_TABLE") != seg6.RT_TABLE_MAIN:
                continue
            dst = r.get_attr("RTA_DST")
            src = r.get_attr("RTA_SRC")
            out.append({
                "dst": f"{dst}/{r['dst_len']}" if dst else "default",
                "from": f"{src}/{r['src_len']}" if src else None,
                "gateway": r.get_attr("RTA_GATEWAY"),
                "encap": seg6.describe_encap(r),
            })
        return out


# ------------------------------------------------------------------------------------------ probing


@dataclass
class ProbeResult:
    src: str
    dst: str
    plane: int
    spine: int | None
    container: str
    links: list[list[str]]
    expected: bool
    reachable: bool
    rtt_ms: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"src": self.src, "dst": self.dst, "plane": self.plane, "spine": self.spine,
                "container": self.container, "links": self.links, "reachable": self.reachable,
                "expected": self.expected, "rtt_ms": self.rtt_ms}


_ICMP6_ECHO_REQUEST: Final = 128
_ICMP6_ECHO_REPLY: Final = 129
_ICMP6_FILTER: Final = 1
_SO_TIMESTAMPNS: Final = 35


def probe(
    name: str, src: str | None = None, dst: str | None = None, timeout_s: float = 1.0,
) -> list[ProbeResult]:
    """One ICMPv6 echo along every micro-SID path (kernel seg6 encap: the request leaves from the path's
    address, so the source-specific route picks the path; the reply returns along the reverse path)."""
    tb = Testbed.load(name)
    topo = tb.topo
    for h in (src, dst):
        if h is not None and h not in topo.host_names():
            raise MrcError(f"testbed {name}: no host {h!r} (hosts: {', '.join(topo.host_names())})")
    paths = topo.paths(src, dst)
    down = tb.down_links()
    ident = os.getpid() & 0xFFFF
    socks: dict[str, socket.socket] = {}
    sent: dict[int, int] = {}  # CLOCK_REALTIME ns just before the send
    rtts: dict[int, float] = {}
    try:
        for h in {p.src for p in paths}:
            sk = netns.socket_in(tb.ns(h), socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
            # receive only echo replies (ICMP6_FILTER: a set bit blocks the type)
            blocked = [0xFFFFFFFF] * 8
            blocked[_ICMP6_ECHO_REPLY >> 5] &= ~(1 << (_ICMP6_ECHO_REPLY & 31))
            sk.setsockopt(socket.IPPROTO_ICMPV6, _ICMP6_FILTER, struct.pack("8I", *blocked))
            # the kernel stamps each reply on arrival: the RTT does not include our own polling delay
            sk.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
            sk.setblocking(False)
            socks[h] = sk
        for seq, p in enumerate(paths):
            msg = struct.pack("!BBHHH", _ICMP6_ECHO_REQUEST, 0, 0, ident, seq) + b"mrc-probe"
            pktinfo = socket.inet_pton(socket.AF_INET6, str(p.path_address)) + struct.pack("@I", 0)
            sent[seq] = time.time_ns()
            try:
                socks[p.src].sendmsg([msg], [(socket.IPPROTO_IPV6, socket.IPV6_PKTINFO, pktinfo)], 0,
                                     (str(topo.mrc_address(p.dst)), 0))
            except OSError as e:
                if e.errno not in (errno.ENETUNREACH, errno.EHOSTUNREACH, errno.ENETDOWN, errno.ENOBUFS):
                    raise
        deadline = time.monotonic() + timeout_s
        by_fd = {sk.fileno(): sk for sk in socks.values()}
        while len(rtts) < len(paths):
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready, _, _ = select.select(list(by_fd), [], [], left)
            for fd in ready:
                while True:
                    try:
                        data, anc, _flags, _addr = by_fd[fd].recvmsg(2048, 64)
                    except BlockingIOError:
                        break
                    if len(data) < 8:
                        continue
                    typ, _code, _ck, rid, seq = struct.unpack("!BBHHH", data[:8])
                    if typ == _ICMP6_ECHO_REPLY and rid == ident and seq in sent and seq not in rtts:
                        arrived = time.time_ns()
                        for level, kind, value in anc:
                            if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS and len(value) >= 16:
                                sec, nsec = struct.unpack("@qq", value[:16])
                                arrived = sec * 10**9 + nsec
                        rtts[seq] = max(0, arrived - sent[seq]) / 1e6
    finally:
        for sk in socks.values():
            sk.close()
    out = []
    for seq, p in enumerate(paths):
        rtt = rtts.get(seq)
        out.append(ProbeResult(
            src=p.src, dst=p.dst, plane=p.plane, spine=p.spine, container=str(p.container),
            links=[list(pair) for pair in p.links], expected=topo.expected_reachable(p, down),
            reachable=rtt is not None, rtt_ms=None if rtt is None else round(rtt, 3),
        ))
    return out
