"""Defects an outside audit found in the configuration loaders (mrcd's host configuration, the topology
files, the fluid model's cluster files): each case failed before its fix, with a traceback, a wrong or
missing line, or unbounded work. The project's rule: a bad file is ``FILE:LINE: key: problem`` (exit code
2 through ConfigError), never a traceback, and every size the input controls is bounded."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from test_hostconfig import BASE

from mrc import hostconfig, topology
from mrc.errors import ConfigError
from mrc.sim.cluster import load_cluster

# a back-to-back host with two planes (line numbers matter: the tests name them): test_hostconfig's
B2B = BASE

# the same on a Clos: a gateway per plane (lines 8 and 13)
CLOS = B2B.replace('"fc00:1::a/64"\n', '"fc00:1::a/64"\ngateway = "fc00:1::1"\n').replace(
    '"fc00:2::a/64"\n', '"fc00:2::a/64"\ngateway = "fc00:2::1"\n').replace('"back-to-back"', '"clos"')

TOPO = """\
[topology]
planes = 2
leaves = 2
spines = 2

[[hosts]]
name = "h0"
leaf = 0
[[hosts]]
name = "h1"
leaf = 1
"""

CLUSTER = """\
[cluster]
planes = 2
leaves = 4
spines = 4
hosts_per_leaf = 4
"""


def _hc_error(tmp_path: Path, text: str, name: str = "mrcd.toml") -> str:
    f = tmp_path / name
    f.write_text(text)
    with pytest.raises(hostconfig.HostConfigError) as e:
        hostconfig.load(f)
    assert isinstance(e.value, ConfigError) and e.value.exit_code == 2
    return str(e.value)


def _topo_error(tmp_path: Path, text: str) -> str:
    f = tmp_path / "t.toml"
    f.write_text(text)
    with pytest.raises(topology.TopologyError) as e:
        topology.load(f)
    return str(e.value)


def _cluster_error(tmp_path: Path, text: str) -> str:
    f = tmp_path / "c.toml"
    f.write_text(text)
    with pytest.raises(ValueError) as e:
        load_cluster(f)
    return str(e.value)


# ------------------------------------------------------------------------ D1: nesting too deep for tomllib

DEEP = "x = " + "[" * 500 + "]" * 500 + "\n"


def test_d1_deep_nesting_is_a_file_error_on_every_toml_surface(tmp_path: Path) -> None:
    """500 nested arrays were a RecursionError traceback out of tomllib (it catches only its own error)."""
    want = ": not valid TOML: nested too deeply"
    assert _hc_error(tmp_path, DEEP).startswith(f"{tmp_path / 'mrcd.toml'}:1{want}")
    msg = _topo_error(tmp_path, TOPO + "\n\n" + DEEP.replace("x", "y"))
    assert msg.startswith(f"{tmp_path / 't.toml'}:14{want}")
    assert _cluster_error(tmp_path, DEEP).startswith(f"{tmp_path / 'c.toml'}:1{want}")
    inline = "x = " + "{a = " * 500 + "1" + "}" * 500 + "\n"
    assert _hc_error(tmp_path, inline).startswith(f"{tmp_path / 'mrcd.toml'}:1{want}")
    # inside a topology that a host configuration references: the topology's own file and line
    (tmp_path / "deep.toml").write_text(TOPO + DEEP.replace("x", "hosts2"))
    msg = _hc_error(tmp_path, '[host]\nname = "h0"\n[[plane]]\ninterface = "e1"\n[[plane]]\n'
                              'interface = "e2"\n[fabric]\ntopology = "deep.toml"\n')
    assert msg.startswith(f"{tmp_path / 'deep.toml'}:12{want}"), msg


def test_d1_the_nesting_bound_is_fixed_not_the_callers_stack(tmp_path: Path) -> None:
    """MAX_NESTING levels parse; one more is refused, whatever stack depth the caller has. Brackets in
    strings and comments are text."""
    n = topology.MAX_NESTING
    ok = f'x = {"[" * n}1{"]" * n}\ns = "{"[" * 99}"\n# {"{" * 99}\nm = """\n{"[" * 99}\n"""\n'
    assert topology.parse_toml(ok, "ok.toml")["x"] is not None
    with pytest.raises(topology.FileError) as e:
        topology.parse_toml(f'a = 1\nx = {"[" * (n + 1)}1{"]" * (n + 1)}\n', "deep.toml")
    assert str(e.value).startswith("deep.toml:2: not valid TOML: nested too deeply")


def test_d1_an_integer_beyond_pythons_digit_limit_is_a_file_error(tmp_path: Path) -> None:
    """tomllib's int() raises a plain ValueError past 4300 digits: it was a traceback too."""
    msg = _hc_error(tmp_path, B2B + "[engine]\nevs = " + "9" * 5000 + "\n")
    assert msg == f"{tmp_path / 'mrcd.toml'}:24: not valid TOML: an integer of more than 4300 digits"


# ------------------------------------------------------------------------------- D2, D3, D13: hostconfig


def test_d2_a_metrics_port_of_thousands_of_digits_is_refused(tmp_path: Path) -> None:
    msg = _hc_error(tmp_path, B2B + '[metrics]\naddress = "127.0.0.1:' + "9" * 4301 + '"\n')
    assert msg.startswith(f"{tmp_path / 'mrcd.toml'}:24: metrics.address: '127.0.0.1:999"), msg
    assert "must be ADDRESS:PORT" in msg and len(msg) < 400


TOPO_CFG = ('[host]\nname = "h0"\n[[plane]]\ninterface = "e1"\n[[plane]]\ninterface = "e2"\n[fabric]\n'
            'topology = "{}"\n')


@pytest.mark.parametrize("name", ["a" * 256, "/" + "abcdefgh/" * 600])
def test_d3_a_topology_path_too_long_for_the_system_is_a_file_error(tmp_path: Path, name: str) -> None:
    """Path.is_file() raised OSError ENAMETOOLONG (a traceback)."""
    msg = _hc_error(tmp_path, TOPO_CFG.format(name))
    assert msg.startswith(f"{tmp_path / 'mrcd.toml'}:8: fabric.topology: cannot read "), msg
    assert msg.endswith(": File name too long") and len(msg) < 400


def test_d13_a_topology_path_that_is_no_regular_file_says_what_it_is(tmp_path: Path) -> None:
    """A directory, a FIFO, /dev/zero and "" were all "no such file"."""
    where = f"{tmp_path / 'mrcd.toml'}:8: fabric.topology: "
    (tmp_path / "dir").mkdir()
    msg = _hc_error(tmp_path, TOPO_CFG.format("dir"))
    assert msg == f"{where}{tmp_path / 'dir'} is a directory, not a topology file"
    os.mkfifo(tmp_path / "fifo")
    msg = _hc_error(tmp_path, TOPO_CFG.format("fifo"))
    assert msg == f"{where}{tmp_path / 'fifo'} is not a regular file (a topology file is one)"
    msg = _hc_error(tmp_path, TOPO_CFG.format("/dev/zero"))
    assert msg == f"{where}/dev/zero is not a regular file (a topology file is one)"
    assert _hc_error(tmp_path, TOPO_CFG.format("")).startswith(f"{where}empty path")
    msg = _hc_error(tmp_path, TOPO_CFG.format("nope.toml"))
    assert msg == f"{where}no such file: {tmp_path / 'nope.toml'}"


# ------------------------------------------------------------------------------- D4: a host's path bound


def _topo_text(planes: int, leaves: int, spines: int, hosts_per_leaf: int) -> str:
    hosts = "".join(f'[[hosts]]\nname = "h{i}"\nleaf = {i // hosts_per_leaf}\n'
                    for i in range(leaves * hosts_per_leaf))
    return f"[topology]\nplanes = {planes}\nleaves = {leaves}\nspines = {spines}\n\n{hosts}"


def _topo_host_cfg(planes: int) -> str:
    ports = "".join(f'[[plane]]\ninterface = "eth{p}"\n' for p in range(planes))
    return f'[host]\nname = "h0"\n\n{ports}\n[fabric]\ntopology = "t.toml"\n'


def test_d4_a_topology_at_every_documented_limit_is_refused_quickly(tmp_path: Path) -> None:
    """16 planes, 256 leaves and 256 spines, 2,048 hosts: within every topology limit, 8.4 million paths
    toward h0's peers. Loading built them all (116 s, 4.3 GB); now the count is refused before any."""
    (tmp_path / "t.toml").write_text(_topo_text(16, 256, 256, 8))

    def no_paths(*_a: object, **_k: object) -> None:
        raise AssertionError("a path was built before the bound refused the topology")

    with pytest.MonkeyPatch.context() as mp:  # refused from the counts alone: not one path is built
        mp.setattr(topology.Topology, "paths", no_paths)
        msg = _hc_error(tmp_path, _topo_host_cfg(16))
    line = 1 + _topo_host_cfg(16).split("\n").index('topology = "t.toml"')
    assert msg == (f"{tmp_path / 'mrcd.toml'}:{line}: fabric.topology: {tmp_path / 't.toml'} gives h0 2047 "
                   "peers over 16 planes with 256 paths per plane toward a peer on another leaf: 8355952 "
                   f"paths, but a host's configuration may hold at most {hostconfig.MAX_PATHS} (fewer hosts, "
                   'planes or spines; docs/deploy.md, "Limits")')


def test_d4_the_bound_counts_exactly_the_paths_loading_builds(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "t.toml").write_text(_topo_text(2, 3, 2, 2))  # h0's peers: 1 on its leaf, 4 elsewhere
    cfg = hostconfig.load(_write(tmp_path, _topo_host_cfg(2)))
    built = sum(max(1, len(pp.paths)) for peer in cfg.peers for pp in peer.planes)
    assert built == hostconfig.topology_path_count(cfg.fabric.topology, "h0") == 2 * (1 + 4 * 2)  # type: ignore[arg-type]
    monkeypatch.setattr(hostconfig, "MAX_PATHS", built)
    hostconfig.load(tmp_path / "mrcd.toml")  # at the bound: loads
    monkeypatch.setattr(hostconfig, "MAX_PATHS", built - 1)
    msg = _hc_error(tmp_path, _topo_host_cfg(2))
    assert "18 paths, but a host's configuration may hold at most 17" in msg


def test_d4_explicit_paths_count_against_the_same_bound(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hostconfig, "MAX_PATHS", 3)
    text = CLOS.replace('address = "fc00:1::b"\n', 'address = "fc00:1::b"\npaths = ["fcbb:bbbb:1::", '
                        '"fcbb:bbbb:2::", "fcbb:bbbb:3::"]\n')
    # three paths on plane 0 fit; plane 1's own path is the fourth
    assert _hc_error(tmp_path, text) == (f"{tmp_path / 'mrcd.toml'}:24: peer[0].plane[1]: 4 paths toward the "
                                         "peers up to here: a host's configuration may hold at most 3 "
                                         '(docs/deploy.md, "Limits")')


def test_d4_one_link_of_a_large_fabric_is_made_without_the_map_of_all() -> None:
    """link_between on a fabric past _DIRECT_LINKS links builds that link alone; equal to the map's."""
    big = topology.generate(16, 256, 256, 8)
    lk = big.link_between("h9", "p3l1")
    assert "_link_map" not in big.__dict__  # the million-link map was not built
    small = topology.generate(3, 3, 2, 2)
    names = [n.name for n in small.nodes()] + ["nope"]
    for x in names:
        for y in names:
            assert small._one_link(x, y) == small._link_map.get(frozenset((x, y)))
    assert lk == topology.generate(16, 4, 2, 8).link_between("h9", "p3l1")  # same node IDs, same link
    with pytest.raises(KeyError, match="no link between h9 and p3l0"):
        big.link_between("h9", "p3l0")


def test_d4_paths_of_one_pair_equal_the_walk_over_all_hosts() -> None:
    t = topology.generate(3, 3, 2, 2)
    for src in [*t.host_names(), "nope"]:
        for dst in [*t.host_names(), "nope"]:
            for plane in (None, 0, 2, 3, -1):
                want = [p for p in t.paths() if p.src == src and p.dst == dst and plane in (None, p.plane)]
                assert t.paths(src, dst, plane) == want


def _write(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "mrcd.toml"
    f.write_text(text)
    return f


# ------------------------------------------------------------------------------------ D5: [[peer]] bound


def _peers_text(n: int, evs: int) -> str:
    head = ('[host]\nname = "a"\nmrc_address = "fd00::a"\nmrc_prefix = "fd00::/48"\n[[plane]]\n'
            'interface = "eth1"\naddress = "fc00:1::a/64"\ngateway = "fc00:1::1"\n[fabric]\nshape = "clos"\n'
            f"[engine]\nevs = {evs}\n")
    peers = "".join(f'[[peer]]\nname = "p{i}"\nmrc_address = "fd00:0:0:{i + 1:x}::1"\n[[peer.plane]]\n'
                    f'address = "fc00:1::{i + 1:x}:2"\n' for i in range(n))
    return head + peers


def test_d5_more_peers_than_any_topology_gives_are_refused(tmp_path: Path) -> None:
    msg = _hc_error(tmp_path, _peers_text(hostconfig.MAX_PEERS + 1, 64))
    assert msg == (f"{tmp_path / 'mrcd.toml'}:13: peer: 2048 [[peer]] tables: at most 2047 (as many peers as "
                   "the largest topology, 2048 hosts, gives a host)")


def test_d5_describe_is_linear_in_the_peers(tmp_path: Path) -> None:
    """2,047 peers with 16,384 EVs: `describe` built each peer's whole EV table and scanned the peers
    list per peer and plane (minutes); it counts the EVs per plane instead and looks peers up by name."""
    cfg = hostconfig.load(_write(tmp_path, _peers_text(hostconfig.MAX_PEERS, hostconfig.MAX_EVS)))

    def no_table(*_a: object, **_k: object) -> None:
        raise AssertionError("describe built a peer's EV table")

    with pytest.MonkeyPatch.context() as mp:  # counts per plane, no EV table per peer
        mp.setattr(hostconfig, "ev_paths", no_table)
        mp.setattr(hostconfig, "ev_table", no_table)
        out = hostconfig.describe(cfg)
    assert "peer p0: MRC address fd00:0:0:1::1, 16384 EVs over 1 planes" in out
    assert "  plane 0 -> fc00:1::7ff:2 via fc00:1::1: 16384 EVs on 1 path" in "\n".join(out)
    assert cfg.peer("p2046").mrc_address == cfg.peers[-1].mrc_address
    with pytest.raises(KeyError, match="no peer 'zz'"):
        cfg.peer("zz")


# --------------------------------------------------------------------------------------- D6 .. D17


def test_d6_a_plane_address_clash_names_the_table_that_wrote_it(tmp_path: Path) -> None:
    """index = 1 on the first table: the clash was reported as plane[1] at the second table's line."""
    text = B2B.replace('interface = "eth1"\naddress = "fc00:1::a/64"',
                       'interface = "eth1"\nindex = 1\naddress = "fd00::a/64"').replace(
        'interface = "eth2"\n', 'interface = "eth2"\nindex = 0\n')
    assert _hc_error(tmp_path, text) == (f"{tmp_path / 'mrcd.toml'}:8: plane[0].address: fd00::a is already "
                                         "host.mrc_address")


@pytest.mark.parametrize("sep", ["\u2028", "\u0085", "\u2029"])
def test_d7_lines_are_counted_by_newlines_only(tmp_path: Path, sep: str) -> None:
    """str.splitlines() also breaks at U+2028, U+0085, U+2029 ...: a comment holding one moved every
    later line number by one."""
    text = f"# a{sep}b\n" + B2B.replace('"back-to-back"', '"ring"')
    assert _hc_error(tmp_path, text).startswith(f"{tmp_path / 'mrcd.toml'}:15: fabric.shape: must be one of")
    assert _topo_error(tmp_path, f"# {sep}\n" + TOPO.replace("planes = 2", "planes = 99")).startswith(
        f"{tmp_path / 't.toml'}:3: topology.planes")
    assert _cluster_error(tmp_path, f"# {sep}\n" + CLUSTER.replace("planes = 2", "planes = 99")).startswith(
        f"{tmp_path / 'c.toml'}:3: cluster.planes")
    lines = topology.key_lines(f'a = "x{sep}y"\nb = """\n{sep}\n"""\nc = 1\n')
    assert (lines["a"], lines["b"], lines["c"]) == (1, 2, 5)


def test_d8_an_unknown_table_written_only_as_a_dotted_header_has_its_line(tmp_path: Path) -> None:
    msg = _hc_error(tmp_path, B2B + "\n[engin.x]\ny = 1\n")
    assert msg.startswith(f"{tmp_path / 'mrcd.toml'}:24: engin: unknown key 'engin'")
    msg = _topo_error(tmp_path, TOPO + "[linkz.x]\ny = 1\n")
    assert msg.startswith(f"{tmp_path / 't.toml'}:12: linkz: unknown")
    assert topology.key_lines("[a]\nb.c.d = 1\n")["a.b"] == 2


def test_d10_a_port_address_with_a_scope_is_refused(tmp_path: Path) -> None:
    """IPv6Interface took fc00:1::a%eth1/64 and dropped the scope without a word."""
    msg = _hc_error(tmp_path, B2B.replace('"fc00:1::a/64"', '"fc00:1::a%eth1/64"'))
    assert msg == (f"{tmp_path / 'mrcd.toml'}:7: plane[0].address: 'fc00:1::a%eth1/64': a port's address "
                   "takes no %scope (the port is its scope)")


def test_d9_a_gateway_scope_only_on_a_link_local_address_of_the_planes_own_interface(tmp_path: Path) -> None:
    ok = hostconfig.loads(CLOS.replace('"fc00:2::1"', '"fe80::1%eth2"'), "ok.toml")
    gw = ok.planes[1].gateway
    # the type stays an IPv6Address; the scope stays on it (str: fe80::1%eth2)
    assert gw is not None and type(gw).__name__ == "IPv6Address" and gw.scope_id == "eth2"
    assert str(gw) == "fe80::1%eth2"
    where = f"{tmp_path / 'mrcd.toml'}:13: plane[1].gateway: "
    assert _hc_error(tmp_path, CLOS.replace('"fc00:2::1"', '"fe80::1%eth1"')) == (
        f"{where}fe80::1%eth1: the %scope must be this plane's interface (eth2)")
    assert _hc_error(tmp_path, CLOS.replace('"fc00:2::1"', '"fc00:2::1%eth2"')) == (
        f"{where}'fc00:2::1%eth2': only a link-local next hop takes a %scope")
    by_mac = CLOS.replace('interface = "eth2"', 'mac = "02:00:00:00:00:02"').replace('"fc00:2::1"',
                                                                                   '"fe80::1%eth2"')
    assert _hc_error(tmp_path, by_mac).startswith(f"{where}fe80::1%eth2: a %scope must name this plane's "
                                                  "interface, and this plane is selected by mac")


def test_d12_cluster_file_keys_get_their_own_line_and_a_wrong_type_is_said(tmp_path: Path) -> None:
    assert _cluster_error(tmp_path, CLUSTER.replace("planes = 2", "planes = 17")) == (
        f"{tmp_path / 'c.toml'}:2: cluster.planes: must be an integer 1..16, got 17")
    assert _cluster_error(tmp_path, CLUSTER.replace("spines = 4", "spines = 0")) == (
        f"{tmp_path / 'c.toml'}:4: cluster.spines: must be an integer 1..2048, got 0")
    assert _cluster_error(tmp_path, CLUSTER.replace("[cluster]", "[[cluster]]")).startswith(
        f"{tmp_path / 'c.toml'}:1: cluster: must be a table ([cluster]), got [{{")
    msg = _cluster_error(tmp_path, 'cluster = "x"\n')
    assert msg == f"{tmp_path / 'c.toml'}:1: cluster: must be a table ([cluster]), got 'x'"


def test_d15_an_entry_of_a_multiline_inline_array_has_its_own_line(tmp_path: Path) -> None:
    text = ('plane = [\n  {interface = "eth1", address = "fc00:1::a/64"},\n'
            '  # a comment, then a string with a comma and a brace\n'
            '  {interface = "eth2", adress = "fc00:2::a/64, }"},\n]\n' + B2B.split("[[plane]]")[0]
            + B2B.split('address = "fc00:2::a/64"\n')[1])
    assert _hc_error(tmp_path, text).startswith(f"{tmp_path / 'mrcd.toml'}:4: plane[1].adress: unknown key")
    lines = topology.key_lines('p = [\n  [1, 2],\n  """x\n]""",\n  3]\nq = 1\n')
    assert (lines["p[0]"], lines["p[1]"], lines["p[2]"], lines["q"]) == (2, 3, 5, 6)


def test_d16_a_gateway_that_is_this_host_or_a_peers_port_is_refused(tmp_path: Path) -> None:
    where = f"{tmp_path / 'mrcd.toml'}"
    assert _hc_error(tmp_path, CLOS.replace('"fc00:1::1"', '"fc00:1::a"')) == (
        f"{where}:8: plane[0].gateway: fc00:1::a is plane[0].address, this host's own: the gateway is the "
        "first switch on the plane")
    assert _hc_error(tmp_path, CLOS.replace('"fc00:2::1"', '"fd00::a"')).startswith(
        f"{where}:13: plane[1].gateway: fd00::a is host.mrc_address, this host's own")
    assert _hc_error(tmp_path, CLOS.replace('address = "fc00:1::b"', 'address = "fc00:1::1"')) == (
        f"{where}:22: peer[0].plane[0].address: fc00:1::1 is plane[0].gateway: a peer's port is not the "
        "first switch")


def test_d17_a_spineless_topology_for_the_simulator_names_its_line(tmp_path: Path) -> None:
    """The testbed takes a leaf-only fabric; the simulator refused it without file line or key."""
    from mrc.sim.experiments import FabricSpec

    f = tmp_path / "nospine.toml"
    f.write_text('[topology]\nplanes = 1\nleaves = 1\nspines = 0\n\n[[hosts]]\nname = "h0"\nleaf = 0\n\n'
                 '[[hosts]]\nname = "h1"\nleaf = 0\n')
    with pytest.raises(topology.TopologyError, match=r"nospine\.toml:4: topology\.spines: the simulator"):
        FabricSpec.from_file(str(f))
