"""mrcd's host configuration file (`mrc.hostconfig`, docs/deploy.md): the examples load, the topology
shape resolves this host's ports and peers from the topology and gives the controller's EV table,
explicit peers give theirs by the same rule, every error reads FILE:LINE: key: problem, and `describe`
covers every plane and peer."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path

import pytest

from mrc import hostconfig, topology
from mrc.ctl.controller import Controller
from mrc.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
B2B_EXAMPLE = DEPLOY / "mrcd.example.toml"
CLOS_EXAMPLE = DEPLOY / "mrcd.clos.example.toml"
DEFAULT_TOPO = DEPLOY / "topologies" / "default.toml"

# Line numbers matter: the error tests below name them.
BASE = """\
[host]
name = "a"
mrc_address = "fd00::a"

[[plane]]
interface = "eth1"
address = "fc00:1::a/64"

[[plane]]
interface = "eth2"
address = "fc00:2::a/64"

[fabric]
shape = "back-to-back"

[[peer]]
name = "b"
mrc_address = "fd00::b"
[[peer.plane]]
address = "fc00:1::b"
[[peer.plane]]
address = "fc00:2::b"
"""

# BASE on a Clos: a prefix, a gateway per plane, paths for b's plane 0, a second peer with paths on both
# planes (the line numbers after line 3 shift)
CLOS = BASE.replace('"fd00::a"\n', '"fd00::a"\nmrc_prefix = "fd00::/48"\n').replace(
    '"fc00:1::a/64"\n', '"fc00:1::a/64"\ngateway = "fe80::1"\n').replace(
    '"fc00:2::a/64"\n', '"fc00:2::a/64"\ngateway = "fc00:2::1"\n').replace(
    '"back-to-back"', '"clos"').replace(
    '"fc00:1::b"\n', '"fc00:1::b"\npaths = [[0x0100, 0x0200, 0x0101, 0x0302], "fcbb:bbbb:100:201:101:302::", '
    '"fc00:99::1"]\n') + """
[[peer]]
name = "c"
mrc_address = "fd00::c"
[[peer.plane]]
address = "fc00:1::c"
paths = [[0x0100, 0x0200, 0x0101, 0x0303]]
[[peer.plane]]
address = "fc00:2::c"
paths = ["fcbb:bbbb:1100:1303::"]

[engine]
evs = 8
"""


def _error(text: str | bytes, tmp_path: Path, name: str = "mrcd.toml") -> str:
    f = tmp_path / name
    if isinstance(text, bytes):
        f.write_bytes(text)
    else:
        f.write_text(text)
    with pytest.raises(hostconfig.HostConfigError) as e:
        hostconfig.load(f)
    assert isinstance(e.value, ConfigError) and e.value.exit_code == 2
    return str(e.value)


# ------------------------------------------------------------------------------------------- examples


def test_back_to_back_example_loads() -> None:
    cfg = hostconfig.load(B2B_EXAMPLE)
    assert (cfg.name, cfg.mrc_address) == ("gpu1", ipaddress.IPv6Address("fd00:0:0:1::1"))
    assert cfg.fabric.shape == "back-to-back" and cfg.fabric.topology is None
    assert [p.interface for p in cfg.planes] == ["eth1", "eth2", "eth3", "eth4"]
    assert [p.index for p in cfg.planes] == [0, 1, 2, 3]
    assert all(p.rate_bps == 100_000_000_000 and p.gateway is None and p.xdp == "auto" for p in cfg.planes)
    assert cfg.peer_names() == ["gpu2"]
    assert cfg.metrics == ("127.0.0.1", 9470)
    assert cfg.socket == Path("/run/mrc/mrcd.sock")
    table = hostconfig.ev_table(cfg, "gpu2")
    assert len(table) == cfg.engine.evs == 64
    for r in table:
        plane = r.ev % 4
        peer_port = cfg.peer("gpu2").planes[plane].address
        # back to back: one path per plane, the link; its outer destination and next hop: the peer's port
        assert (r.path.plane, r.path.container, r.next_hop, r.port.interface) == (
            plane, peer_port, peer_port, f"eth{plane + 1}")
        assert (r.path.src, r.path.dst, r.path.path_address) == ("gpu1", "gpu2", cfg.mrc_address)
    # each plane's wire is a link of its own (the controller keys its EV sets by link)
    assert len({frozenset(r.path.links[0]) for r in table}) == 4


def test_clos_example_resolves_the_host_from_the_topology() -> None:
    cfg = hostconfig.load(CLOS_EXAMPLE)
    topo = topology.load(DEFAULT_TOPO)
    assert cfg.fabric.topology_file == CLOS_EXAMPLE.parent / "topologies" / "default.toml"
    assert cfg.fabric_host == "h0" and cfg.fabric.shape == "clos"
    assert cfg.mrc_address == topo.mrc_address("h0") and cfg.mrc_prefix == topo.mrc_prefix
    assert cfg.peer_names() == ["h1", "h2", "h3"]
    for p in cfg.planes:
        lk = topo.link_between("h0", topo.leaf_name(p.index, topo.host_leaf("h0")))
        assert p.address.ip == topo.port_address("h0", p.index) == lk.a_addr
        assert p.gateway == lk.b_addr and p.rate_bps == topo.link.rate_bps
    assert [p.xdp for p in cfg.planes] == ["native", "auto", "auto", "auto"]
    for peer in cfg.peers:
        assert peer.mrc_address == topo.mrc_address(peer.name)
        assert [pp.address for pp in peer.planes] == [topo.port_address(peer.name, i) for i in range(4)]


def test_topology_ev_table_is_the_controllers() -> None:
    """The EV -> path table `ev_paths` gives is the one `Controller.add_peer` computes (and mrcd fills
    the path map with), for a host on the same leaf and one across the spines."""
    cfg = hostconfig.load(CLOS_EXAMPLE)
    topo = topology.load(DEFAULT_TOPO)
    ctl = Controller(topo, "h0", 64)
    for peer in ("h1", "h2", "h3"):
        ctl.add_peer(peer)
        assert hostconfig.ev_paths(cfg, peer) == ctl.routes[peer].paths
    table = hostconfig.ev_table(cfg, "h3")
    assert {r.path.spine for r in table if r.path.plane == 2} == {0, 1}
    assert all(r.next_hop == cfg.planes[r.path.plane].gateway for r in table)


def test_doc_examples_load() -> None:
    """Every complete configuration in docs/deploy.md (a ```toml block with a [host] table) loads, the
    topology one relative to deploy/."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", text, re.S) if b.startswith("[host]")]
    assert len(blocks) >= 3
    shapes = set()
    for b in blocks:
        cfg = hostconfig.loads(b, "docs/deploy.md", base=DEPLOY)
        shapes.add((cfg.fabric.shape, cfg.fabric.topology is not None))
        assert hostconfig.describe(cfg)
    assert shapes == {("back-to-back", False), ("clos", False), ("clos", True)}


# ------------------------------------------------------------------------------------------- explicit clos


def test_explicit_clos_paths_and_ev_table() -> None:
    cfg = hostconfig.loads(CLOS, "clos.toml")
    b = cfg.peer("b")
    usid, given, opaque = b.planes[0].paths
    assert usid.container == ipaddress.IPv6Address("fcbb:bbbb:100:200:101:302::")
    assert usid.usids == (0x0100, 0x0200, 0x0101, 0x0302)
    assert given.usids == (0x0100, 0x0201, 0x0101, 0x0302)  # decoded from the container
    assert opaque.usids == ()  # outside the micro-SID block: an opaque outer destination
    assert b.planes[1].paths == ()
    paths = hostconfig.ev_paths(cfg, "b")
    # EV i: plane i mod 2, then round-robin over that plane's listed paths
    assert [p.plane for p in paths] == [0, 1] * 4
    assert [p.container for p in paths[0::2]] == [usid.container, given.container, opaque.container,
                                                  usid.container]
    # plane 1 lists no path: the fabric routes the peer's plane address itself
    assert {p.container for p in paths[1::2]} == {ipaddress.IPv6Address("fc00:2::b")}
    assert paths[0].hops == ("a", "p0:0100", "p0:0200", "p0:0101", "p0:0302", "b")
    assert paths[4].hops == ("a", "p0:fc00:99::1", "b")
    assert paths[1].hops == ("a", "p1:fabric", "b") and paths[1].spine is None
    assert [paths[i].spine for i in (0, 2, 4, 6)] == [0, 1, 2, 0]
    # two peers' paths through one switch share its links (the controller correlates them)
    c0 = hostconfig.ev_paths(cfg, "c")[0]
    assert set(paths[0].links[:3]) & set(c0.links) == {("a", "p0:0100"), ("p0:0100", "p0:0200"),
                                                        ("p0:0200", "p0:0101")}
    hops = [r.next_hop for r in hostconfig.ev_table(cfg, "b")[:2]]
    assert hops == [ipaddress.IPv6Address("fe80::1"), ipaddress.IPv6Address("fc00:2::1")]


def test_mrcds_delayed_ack_is_longer_only_where_it_can_coalesce_at_the_ports_rate() -> None:
    """Two 8 KiB packets within 50 us need 2.6 Gbit/s: 4 x 10 Gbit/s and 100 Gbit/s ports get mrcd's
    longer delayed ACK; 4 x 100 Mbit/s and 1 x 1 Gbit/s keep the engine's 4 us (there the delay would
    coalesce nothing, only wake the loop once more per packet); ports whose rate is not known yet (a
    real NIC before mrcd reads it) count as fast."""
    from mrc.transport import QpAttr

    longer, engine = hostconfig.MRCD_ACK_DELAY_NS, QpAttr().ack_delay_ns
    assert longer > engine
    assert hostconfig.mrcd_ack_delay_ns([10**10] * 4, 8192) == longer
    assert hostconfig.mrcd_ack_delay_ns([10**11], 8192) == longer
    assert hostconfig.mrcd_ack_delay_ns([10**8] * 4, 8192) == engine
    assert hostconfig.mrcd_ack_delay_ns([10**9], 8192) == engine
    assert hostconfig.mrcd_ack_delay_ns([10**9, None], 8192) == longer
    assert hostconfig.mrcd_ack_delay_ns([], 8192) == longer
    auto = hostconfig.loads(BASE, "a.toml")
    assert hostconfig.qp_attr(auto, 8192, [10**8] * 4).ack_delay_ns == engine
    assert hostconfig.qp_attr(auto, 8192, [10**10] * 4).ack_delay_ns == longer


def test_the_payload_follows_the_smallest_port_mtu_or_the_file() -> None:
    # a real host's NICs often have an MTU of 1500: 4 KiB payloads (the engine's default) would be
    # dropped at the port, so mrcd takes the largest power of two the smallest port carries whole
    auto = hostconfig.loads(BASE, "a.toml")
    assert hostconfig.payload_size(auto, {"eth1": 9000, "eth2": 9000}) == 8192
    assert hostconfig.payload_size(auto, {"eth1": 9000, "eth2": 1500}) == 1024
    assert hostconfig.payload_size(auto, {"eth1": 4244}) == 4096
    attr = hostconfig.qp_attr(auto, 1024)
    attr.check()
    assert (attr.mtu, attr.ack_req_floor) == (1024, 0)
    nscc = hostconfig.nscc_config(auto, 1024)
    assert nscc is not None and nscc.eta == pytest.approx(0.15 * 1024)
    assert nscc.max_cwnd == hostconfig.max_window(auto)
    fixed = hostconfig.loads(BASE + '[engine]\nmtu = "4KiB"\n', "f.toml")
    assert fixed.engine.mtu == 4096
    assert hostconfig.payload_size(fixed, {"eth1": 9000, "eth2": 4244}) == 4096
    with pytest.raises(hostconfig.HostConfigError) as err:
        hostconfig.payload_size(fixed, {"eth1": 9000, "eth2": 1500})
    assert str(err.value) == ("f.toml:24: engine.mtu: 4096-byte payloads need an MTU of at least 4244 on "
                              "every port (148 bytes of headers with the SRv6 encapsulation); eth2 has "
                              "1500 (at most 1024 fits)")
    assert hostconfig.loads(BASE + '[engine]\nmtu = "auto"\n', "x.toml").engine.mtu is None
    with pytest.raises(hostconfig.HostConfigError, match=r"a.toml: plane.interface: eth2: an MTU of 300"):
        hostconfig.payload_size(auto, {"eth1": 9000, "eth2": 300})


def test_engine_objects_follow_the_file() -> None:
    cfg = hostconfig.loads(BASE + '[engine]\nevs = 16\ncc = "none"\nreorder_us = 500\n'
                                  "probe_timeout_us = 7000\nack_timeout = 10\n", "e.toml")
    attr = hostconfig.qp_attr(cfg)
    assert (attr.timeout, attr.reorder_ns, attr.probe_timeout_ns) == (10, 500_000, 7_000_000)
    attr.check()
    assert hostconfig.nscc_config(cfg) is None
    assert len(hostconfig.ev_paths(cfg, "b")) == 16
    cfg = hostconfig.loads(BASE + '[engine]\nbase_rtt_us = 40\nmax_window = "1MiB"\n', "e.toml")
    nscc = hostconfig.nscc_config(cfg)
    assert nscc is not None and nscc.max_cwnd == 1 << 20  # [engine] max_window is the largest window
    assert nscc.base_rtt == 40_000 and nscc.target_delay == 30_000
    dflt = hostconfig.loads(BASE, "d.toml")
    assert (dflt.engine.evs, dflt.engine.cc, dflt.metrics, dflt.socket) == (
        64, "nscc", None, Path(hostconfig.DEFAULT_SOCKET))
    buf = topology.LinkParams().buffer_bytes
    assert hostconfig.max_window(dflt) == 2 * buf // 3 * 3 // 2  # rates unknown: a third of 2 buffers
    # the window follows the ports' BDP at the base RTT (500 us), between a third of the queues' buffers
    # and all of them: 2 x 100 Mbit/s (12.5 KB) -> the third; 2 x 1 Gbit/s -> 125 KB; 2 x 10 -> the buffers
    assert hostconfig.max_window(dflt, [10**8, 10**8]) == 2 * buf // 3 * 3 // 2
    assert hostconfig.max_window(dflt, [10**9, 10**9]) == 125_000 * 3 // 2
    assert hostconfig.max_window(dflt, [10**10, 10**10]) == 2 * buf * 3 // 2
    assert hostconfig.window_bdp(4, 4 * 10**10, 128 << 10, 500_000) == 512 << 10
    assert hostconfig.port_rates(dflt) == [None, None]
    assert hostconfig.loads(BASE + "[metrics]\n", "m.toml").metrics == ("127.0.0.1", 9470)
    assert hostconfig.loads(BASE + '[metrics]\naddress = "[::1]:9100"\n', "m.toml").metrics == ("::1", 9100)


def test_port_selectors_and_plane_order() -> None:
    text = BASE.replace('interface = "eth1"', 'pci = "3B:00.1"\nindex = 1').replace(
        'interface = "eth2"', 'mac = "02:AA:00:00:00:02"\nindex = 0')
    cfg = hostconfig.loads(text, "p.toml")
    # planes sorted by index: the second table is plane 0
    assert [(p.index, p.pci, p.mac) for p in cfg.planes] == [(0, None, "02:aa:00:00:00:02"),
                                                            (1, "0000:3b:00.1", None)]
    assert cfg.planes[0].address.ip == ipaddress.IPv6Address("fc00:2::a")
    assert cfg.planes[1].selector == "pci 0000:3b:00.1"


def test_key_lines_under_array_entries() -> None:
    lines = topology.key_lines(CLOS)
    assert lines["peer[1].plane[0]"] == 31 and lines["peer[1].plane[1].paths"] == 36
    assert topology.key_line(lines, "peer[0].plane[0].paths[2]") == 24


# ------------------------------------------------------------------------------------------- errors

ERRORS = [
    # unknown keys, with the nearest known one
    (BASE.replace('address = "fc00:2::b"', 'adress = "fc00:2::b"'), "peer[0].plane[1].adress", 22,
     "unknown key 'adress' (did you mean 'address'?)"),
    (BASE + "[engine]\nevz = 3\n", "engine.evz", 24, "unknown key 'evz' (did you mean 'evs'?)"),
    ("colour = 1\n" + BASE, "colour", 1, "unknown key 'colour' (expected one of: host, plane"),
    # missing keys: the line of their table
    (BASE.replace('mrc_address = "fd00::a"\n', ""), "host.mrc_address", 1, "missing field"),
    (BASE.replace('address = "fc00:2::a/64"\n', ""), "plane[1].address", 9, "missing field"),
    (BASE.replace('interface = "eth2"\n', ""), "plane[1]", 9, "missing: one of interface, pci, mac"),
    (BASE.replace('shape = "back-to-back"', ""), "fabric.shape", 13, "missing field"),
    # wrong types and values
    (BASE.replace('name = "a"', "name = 7"), "host.name", 2, "must be a string"),
    (BASE.replace('interface = "eth2"', 'interface = "eth2"\npci = "0000:3b:00.0"'), "plane[1].pci", 11,
     "exactly one of interface, pci, mac"),
    (BASE.replace('"eth2"', '"a-very-long-ifname"'), "plane[1].interface", 10, "not an interface name"),
    (BASE.replace('interface = "eth2"', 'mac = "01:00:5e:00:00:01"'), "plane[1].mac", 10,
     "not a port's unicast"),
    (BASE.replace('interface = "eth2"', 'pci = "3b:00"'), "plane[1].pci", 10, "not a PCI address"),
    (BASE.replace('address = "fc00:2::a/64"', 'address = "fc00:2::a/64"\nxdp = "fast"'), "plane[1].xdp", 12,
     "must be one of 'native', 'generic', 'auto'"),
    (BASE.replace('address = "fc00:2::a/64"', 'address = "fc00:2::a/64"\nrate = "fast"'), "plane[1].rate", 12,
     "not a rate"),
    (BASE.replace('address = "fc00:2::a/64"', 'address = "fc00:2::a/64"\nrate = "9tbit"'), "plane[1].rate",
     12, "must be 1kbit..1600gbit"),
    (BASE + "[engine]\nevs = 1\n", "engine.evs", 24, "need at least one EV per plane (2 planes)"),
    (BASE + "[engine]\nevs = 100000\n", "engine.evs", 24, "must be 1..16384, got 100000"),
    (BASE + "[engine]\nack_timeout = 25\n", "engine.ack_timeout", 24, "must be 0..24"),
    (BASE + '[engine]\ncc = "reno"\n', "engine.cc", 24, "must be one of 'nscc', 'none'"),
    (BASE + "[engine]\nreorder_us = true\n", "engine.reorder_us", 24, "must be an integer, got True"),
    (BASE + '[engine]\nmax_window = "1K"\n', "engine.max_window", 24, "must be 8KiB..1GiB"),
    (BASE + '[metrics]\naddress = "localhost:9470"\n', "metrics.address", 24, "must be ADDRESS:PORT"),
    (BASE + '[metrics]\naddress = "127.0.0.1:70000"\n', "metrics.address", 24, "must be ADDRESS:PORT"),
    (BASE + '[control]\nsocket = "run/mrcd.sock"\n', "control.socket", 24, "absolute file path"),
    (BASE + f'[control]\nsocket = "/{"x" * 120}"\n', "control.socket", 24, "at most 107"),
    (BASE.replace('shape = "back-to-back"', 'shape = "ring"'), "fabric.shape", 14, "must be one of"),
    # addresses
    (BASE.replace('"fd00::a"', '"fd00::zz"'), "host.mrc_address", 3, "not an IPv6 address: 'fd00::zz'"),
    (BASE.replace('"fd00::a"', '"10.0.0.1"'), "host.mrc_address", 3, "is IPv4"),
    (BASE.replace('"fd00::a"', '"ff02::1"'), "host.mrc_address", 3, "not a unicast address"),
    (BASE.replace('"fc00:2::b"', '"fe80::b"'), "peer[0].plane[1].address", 22, "is link-local"),
    (BASE.replace('"fc00:1::a/64"', '"fc00:1::a/200"'), "plane[0].address", 7, "not an IPv6 address or"),
    (BASE.replace('"fd00::b"', '"fd00::a"'), "peer[0].mrc_address", 18,
     "fd00::a is already host.mrc_address (this host's own)"),
    (BASE.replace('"fc00:2::b"', '"fc00:2::a"'), "peer[0].plane[1].address", 22,
     "fc00:2::a is already plane[1].address (this host's own)"),
    (BASE.replace('"fc00:2::a/64"', '"fc00:1::a/64"'), "plane[1].address", 11, "already plane[0].address"),
    (BASE.replace('mrc_address = "fd00::a"', 'mrc_address = "fd00::a"\nmrc_prefix = "fd01::/48"'),
     "host.mrc_prefix", 4, "does not hold host.mrc_address"),
    (CLOS.replace('mrc_address = "fd00::c"', 'mrc_address = "fd01::c"'), "peer[1].mrc_address", 30,
     "not in host.mrc_prefix fd00::/48"),
    # planes
    (BASE.replace('"eth2"', '"eth1"'), "plane[1].interface", 10, "eth1 is already plane[0].interface"),
    (BASE.replace('interface = "eth2"', 'interface = "eth2"\nindex = 0'), "plane[1].index", 11,
     "plane 0 is already plane[0]"),
    (BASE.replace('interface = "eth2"', 'interface = "eth2"\nindex = 2'), "plane[1].index", 11,
     "must be 0..1"),
    (BASE.replace('[[peer.plane]]\naddress = "fc00:2::b"\n', ""), "peer[0].plane", 19,
     "1 [[peer.plane]] tables, but this host has 2 planes"),
    # the fabric shapes
    (BASE + '[[peer]]\nname = "c"\n', "peer[1]", 23, "exactly one peer (one link per plane), got 2"),
    (BASE.replace('address = "fc00:1::a/64"', 'address = "fc00:1::a/64"\ngateway = "fe80::1"'),
     "plane[0].gateway", 8, "a back-to-back plane has no gateway"),
    (BASE.replace('address = "fc00:1::b"', 'address = "fc00:1::b"\npaths = ["fcbb:bbbb:100::"]'),
     "peer[0].plane[0].paths", 21, "a back-to-back plane has one path"),
    (BASE.replace('name = "b"', 'name = "a"'), "peer[0].name", 17, "this host's own name"),
    (BASE.replace('shape = "back-to-back"', 'shape = "clos"'), "plane[0].gateway", 5,
     "a clos plane's next hop"),
    (CLOS.replace('name = "c"', 'name = "b"'), "peer[1].name", 29, "'b' is already peer[0]"),
    (CLOS.replace("0x0101, 0x0302]", "0x0101, 0x10000]"), "peer[0].plane[0].paths[0]", 24,
     "must be 1..65535"),
    (CLOS.replace("[[0x0100, 0x0200, 0x0101, 0x0303]]", "[[1, 2, 3, 4, 5, 6, 7]]"),
     "peer[1].plane[0].paths[0]", 33, "holds 1..6 micro-SIDs, got 7"),
    (CLOS.replace('"fc00:99::1"]', '"fc00:99::1", "fc00:99::1"]'), "peer[0].plane[0].paths[3]", 24,
     "fc00:99::1 is listed twice"),
    (CLOS.replace('"fc00:99::1"]', '"fc00:99::1", 5]'), "peer[0].plane[0].paths[3]", 24,
     "a path is a container"),
    (CLOS.replace("evs = 8", "evs = 4"), "peer[0].plane[0].paths", 24, "3 paths, but only 2 of the 4 EVs"),
    (CLOS.replace('shape = "clos"', 'shape = "clos"\nusid_block = "fcbb::/20"'), "fabric.usid_block", 18,
     "must be a /16, /32"),
    (BASE.replace("[[peer]]", "[[per]]").replace("[[peer.plane]]", "[[per.plane]]"), "per", 16,
     "unknown key 'per' (did you mean 'peer'?)"),
    (BASE.split("[[peer]]")[0], "peer", None, "missing: one [[peer]] table per peer"),
    (BASE + '[engine]\nmtu = 3000\n', "engine.mtu", 24, "must be \"auto\" or a power of two 256..8192"),
    (BASE + '[engine]\nmtu = "16KiB"\n', "engine.mtu", 24, "got 16384"),
    (BASE + '[engine]\nmtu = "jumbo"\n', "engine.mtu", 24, "must be \"auto\" or a payload size"),
    # what a regex's "$" let through (it also matches before a final newline), non-ASCII digits, NULs
    (BASE.replace('name = "a"', 'name = "a\\n"'), "host.name", 2, "must be 1..63 lowercase"),
    (BASE.replace('name = "b"', 'name = "b\\n"'), "peer[0].name", 17, "must be 1..63 lowercase"),
    (BASE.replace('interface = "eth2"', 'mac = "02:00:00:00:00:01\\n"'), "plane[1].mac", 10, "not a MAC"),
    (BASE.replace('"eth2"', '"eth\\u00002"'), "plane[1].interface", 10, "control characters"),
    (BASE + '[metrics]\naddress = "127.0.0.1:\u00b2"\n', "metrics.address", 24, "must be ADDRESS:PORT"),
    (BASE + '[metrics]\naddress = "127.0.0.1:\uff19\uff14\uff17\uff10"\n', "metrics.address", 24,
     "must be ADDRESS:PORT"),
    (BASE + '[control]\nsocket = "/run/a\\u0000b"\n', "control.socket", 24, "printable"),
    (BASE.replace('address = "fc00:2::a/64"', 'address = "fc00:2::a/0"'), "plane[1].address", 11,
     "a port's prefix is /16../128"),
    (BASE.replace('address = "fc00:2::a/64"', 'address = "fc00:2::a/64"\nrate = "' + "9" * 400 + '"'),
     "plane[1].rate", 12, "out of range"),
]


@pytest.mark.parametrize(("text", "key", "line", "problem"), ERRORS)
def test_errors_name_file_line_key_problem(tmp_path: Path, text: str, key: str, line: int | None,
                                           problem: str) -> None:
    msg = _error(text, tmp_path)
    where = f"{tmp_path / 'mrcd.toml'}" + ("" if line is None else f":{line}")
    assert msg.startswith(f"{where}: {key}: "), msg
    assert problem in msg, msg


def test_a_control_socket_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    """mrcd (root) used to unlink whatever the configured socket path named and bind there: a file of
    the operator's went (`socket = "/etc/passwd"` passed --check-config). A file or a directory there is
    refused with the key and line; a socket (a stale one of a killed mrcd) is accepted."""
    import socket as so

    precious = tmp_path / "precious"
    precious.write_text("keep me")
    for target, kind in ((precious, "a file that is not a socket"), (tmp_path, "a directory")):
        msg = _error(BASE + f'[control]\nsocket = "{target}"\n', tmp_path)
        assert msg.startswith(f"{tmp_path / 'mrcd.toml'}:24: control.socket: "), msg
        assert kind in msg, msg
    assert precious.read_text() == "keep me"
    stale = tmp_path / "stale.sock"
    with so.socket(so.AF_UNIX, so.SOCK_STREAM) as s:
        s.bind(str(stale))
    f = tmp_path / "ok.toml"
    f.write_text(BASE + f'[control]\nsocket = "{stale}"\n')
    assert hostconfig.load(f).socket == stale


def test_a_byte_order_mark_and_control_characters_are_named(tmp_path: Path) -> None:
    """A file that starts with a UTF-8 byte-order mark (some Windows editors write one) was "not valid
    TOML: Invalid statement (column 1)", naming nothing one could see; a path with a newline or an escape
    sequence was printed raw, splitting the one-line error (or driving the terminal)."""
    msg = _error(b"\xef\xbb\xbf" + BASE.encode(), tmp_path)
    assert msg == (f"{tmp_path / 'mrcd.toml'}:1: starts with a UTF-8 byte-order mark (EF BB BF): save it as "
                   "UTF-8 without one")
    msg = _error(BASE.replace('shape = "back-to-back"', 'topology = "x\\ny\\u001b[31m.toml"'), tmp_path)
    assert "\n" not in msg and "\x1b" not in msg and "fabric.topology" in msg, msg
    assert "'" + str(tmp_path) + "/x\\ny\\x1b[31m.toml'" in msg, msg


def test_an_empty_path_names_no_directory() -> None:
    """`mrcd --check-config ""` said ".: cannot read: Is a directory"."""
    with pytest.raises(hostconfig.HostConfigError, match="no configuration file named"):
        hostconfig.load("")


def test_syntax_encoding_and_unreadable_files(tmp_path: Path) -> None:
    f = tmp_path / "mrcd.toml"
    assert re.fullmatch(rf"{re.escape(str(f))}:3: not valid TOML: .* \(column \d+\)",
                        _error('[host]\nname = "a"\nmrc_address = fd00::a\n', tmp_path))
    msg = _error(b'[host]\nname = "a"\n# caf\xe9\n', tmp_path)
    assert msg.startswith(f"{f}:3: not UTF-8 text: byte 0xe9"), msg
    with pytest.raises(hostconfig.HostConfigError, match=r"missing\.toml: cannot read"):
        hostconfig.load(tmp_path / "missing.toml")
    assert _error("", tmp_path) == f"{f}: host: missing table: [host] with name and mrc_address"


TOPO_CFG = """\
[host]
name = "h1"

[[plane]]
interface = "eth1"
[[plane]]
interface = "eth2"

[fabric]
topology = "topo.toml"
"""


def test_topology_reference_errors(tmp_path: Path) -> None:
    topo = tmp_path / "topo.toml"
    topo.write_text((DEPLOY / "topologies" / "small.toml").read_text())
    small = topology.load(topo)
    assert small.planes == 2 and "h1" in small.host_names()
    # relative to the configuration file's directory, and the peers come from the topology
    cfg = hostconfig.load(_write(tmp_path, TOPO_CFG))
    assert cfg.fabric.topology_file == topo
    assert cfg.peer_names() == [h for h in small.host_names() if h != "h1"]
    assert cfg.mrc_address == small.mrc_address("h1")
    f = tmp_path / "mrcd.toml"
    assert _error(TOPO_CFG.replace("topo.toml", "nope.toml"), tmp_path) == (
        f"{f}:10: fabric.topology: no such file: {tmp_path / 'nope.toml'}")
    assert _error(TOPO_CFG + 'host = "zz"\n', tmp_path).startswith(f"{f}:11: fabric.host: no host 'zz' in ")
    assert _error(TOPO_CFG.replace("[[plane]]\ninterface = \"eth2\"\n", ""), tmp_path).startswith(
        f"{f}:4: plane: 1 [[plane]] tables, but the topology {topo} has 2 planes")
    bad = TOPO_CFG.replace('name = "h1"', 'name = "h1"\nmrc_address = "fd00:0:0:7::1"')
    assert _error(bad, tmp_path).startswith(f"{f}:3: host.mrc_address: fd00:0:0:7::1 is not h1's MRC address")
    bad = TOPO_CFG.replace('"eth1"', '"eth1"\naddress = "fc00::9/64"')
    assert f"{f}:6: plane[0].address: fc00::9 is not h1's plane-0 port address" in _error(bad, tmp_path)
    assert _error(TOPO_CFG + "[[peer]]\n", tmp_path).startswith(f"{f}:11: peer: not with fabric.topology")
    assert _error(TOPO_CFG + 'shape = "back-to-back"\n', tmp_path).startswith(
        f"{f}:11: fabric.shape: a topology is a clos")
    # an error inside the topology keeps the topology's own file and line
    topo.write_text(topo.read_text().replace("[topology]", "[topology]\nwidth = 3"))
    assert _error(TOPO_CFG, tmp_path).startswith(f"{topo}:")
    msg = _error(TOPO_CFG, tmp_path)
    line = topology.key_lines(topo.read_text())["topology.width"]
    assert msg.startswith(f"{topo}:{line}: topology.width: unknown key"), msg


def test_a_bare_topology_name_falls_back_to_the_shipped_example(tmp_path: Path) -> None:
    """Installed as /etc/mrc/mrcd.toml, the clos example named "topologies/default.toml" beside it, which
    nothing installs: a bare name that is not beside the file is the example shipped with mrc (in the
    wheel too); a file of that name beside it wins; a path with a folder is never redirected."""
    cfg = hostconfig.load(_write(tmp_path, TOPO_CFG.replace("topo.toml", "small.toml")))
    assert cfg.fabric.topology_file == topology.default_topology_dir() / "small.toml"
    mine = tmp_path / "small.toml"
    mine.write_text((DEPLOY / "topologies" / "small.toml").read_text())
    cfg = hostconfig.load(_write(tmp_path, TOPO_CFG.replace("topo.toml", "small.toml")))
    assert cfg.fabric.topology_file == mine
    f = tmp_path / "mrcd.toml"
    assert _error(TOPO_CFG.replace("topo.toml", "sub/small.toml"), tmp_path) == (
        f"{f}:10: fabric.topology: no such file: {tmp_path / 'sub' / 'small.toml'}")
    # the shipped clos example, copied away from the checkout (as deploy/install.sh installs it)
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "mrcd.toml").write_text(CLOS_EXAMPLE.read_text())
    shipped = topology.default_topology_dir() / "default.toml"
    assert hostconfig.load(etc / "mrcd.toml").fabric.topology_file == shipped


def _write(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "mrcd.toml"
    f.write_text(text)
    return f


# ------------------------------------------------------------------------------------------- describe


def test_describe_covers_every_plane_and_peer() -> None:
    cfg = hostconfig.load(CLOS_EXAMPLE)
    lines = hostconfig.describe(cfg)
    text = "\n".join(lines)
    for p in cfg.planes:
        (line,) = [x for x in lines if x.startswith(f"plane {p.index}: ")]
        assert f"interface {p.interface}" in line and str(p.address) in line and str(p.gateway) in line
        assert ("XDP native" in line) == (p.index == 0)
    for peer in cfg.peers:
        at = lines.index(f"peer {peer.name}: MRC address {peer.mrc_address}, 64 EVs over 4 planes")
        assert [x.split(" -> ")[0] for x in lines[at + 1:at + 5]] == [f"  plane {p}" for p in range(4)]
        for plane in range(4):
            line = lines[at + 1 + plane]
            for path in hostconfig.plane_paths(cfg, peer.name, plane):
                assert str(path.container) in line
            assert "16 EVs on" in line
    assert "route fd00::/48 dev mrc0 src fd00::1" in text
    assert "metrics: http://127.0.0.1:9470/metrics" in lines
    assert "control socket: /run/mrc/mrcd.sock (mode 0600, root only)" in lines
    assert "ACK timeout 2^15 x 1.024 us = 33.6 ms" in text


def test_describe_explicit_fabric() -> None:
    cfg = hostconfig.loads(CLOS.replace('mrc_prefix = "fd00::/48"\n', ""), "clos.toml")
    lines = hostconfig.describe(cfg)
    assert any("routes fd00::b/128, fd00::c/128 dev mrc0" in x for x in lines)
    assert lines[1].startswith("plane 0: interface eth1: address fc00:1::a/64, next hop fe80::1; "
                               "host_ingress XDP auto")
    (b0,) = [x for x in lines if x.startswith("  plane 0 -> fc00:1::b")]
    assert "4 EVs on 3 paths (1-2 EVs each)" in b0 and "(p0:0100-p0:0200-p0:0101-p0:0302)" in b0
    assert "metrics: off" in lines and "CC nscc" in lines[-3]
    b2b = hostconfig.describe(hostconfig.load(B2B_EXAMPLE))
    assert sum(x.startswith("  plane ") and "(p" in x and ":link)" in x for x in b2b) == 4


def test_special_files_are_refused_without_reading_them(tmp_path: Path) -> None:
    """A FIFO is not waited on and a character device (/dev/zero: no end) is not read: each is refused
    as not a regular file; a file over the size bound is refused before it is parsed."""
    import os

    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    for f in (fifo, Path("/dev/zero")):
        with pytest.raises(hostconfig.HostConfigError, match="not a regular file"):
            hostconfig.load(f)
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (topology.MAX_FILE_BYTES + 1))
    with pytest.raises(hostconfig.HostConfigError, match="larger than"):
        hostconfig.load(big)
