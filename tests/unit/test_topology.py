"""The topology model: derived addressing, micro-SID containers, the path set, and TOML errors that name
the file, the key and the problem."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from mrc import topology, units
from mrc.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TOPOS = ROOT / "deploy" / "topologies"


@pytest.fixture(scope="module")
def default() -> topology.Topology:
    return topology.load(TOPOS / "default.toml")


def test_default_shape(default: topology.Topology) -> None:
    assert (default.planes, default.leaves, default.spines) == (4, 2, 2)
    assert default.host_names() == ["h0", "h1", "h2", "h3"]
    assert default.link.mtu == 9000
    nodes = default.nodes()
    assert len(nodes) == 4 + 4 * (2 + 2)
    # every host has one port per plane; every leaf links every spine of its plane; no inter-plane link
    links = default.links()
    assert len(links) == 4 * 4 + 4 * 2 * 2
    for lk in links:
        for end in (lk.a, lk.b):
            n = default.node(end)
            assert n.is_host or n.plane == lk.plane
    for h in default.host_names():
        assert sorted(lk.plane for lk in default.links_of(h)) == [0, 1, 2, 3]


def test_names_fit_ifnamsiz(default: topology.Topology) -> None:
    for lk in default.links():
        assert len(lk.a_ifname) <= 15 and len(lk.b_ifname) <= 15


def test_usids_and_containers(default: topology.Topology) -> None:
    assert default.node_usid("p0l1") == 0x0101
    assert default.node_usid("p2s0") == 0x2200
    assert default.node_usid("h3", plane=1) == 0x1303
    p = default.path("h0", "h2", 1, 1)
    assert p.hops == ("h0", "p1l0", "p1s1", "p1l1", "h2")
    assert p.usids == (0x1100, 0x1201, 0x1101, 0x1302)
    assert p.container == ipaddress.IPv6Address("fcbb:bbbb:1100:1201:1101:1302::")
    assert p.links == (("h0", "p1l0"), ("p1l0", "p1s1"), ("p1s1", "p1l1"), ("p1l1", "h2"))
    within = default.path("h0", "h1", 3, None)
    assert within.container == ipaddress.IPv6Address("fcbb:bbbb:3100:3301::")
    assert default.usid_prefix("p0s1") == ipaddress.IPv6Network("fcbb:bbbb:201::/48")


def test_path_set(default: topology.Topology) -> None:
    paths = default.paths()
    # 4 same-leaf ordered pairs x 1 path + 8 cross-leaf pairs x 2 spines, in each of 4 planes
    assert len(paths) == 4 * (4 * 1 + 8 * 2)
    assert len({(p.src, p.container) for p in paths}) == len(paths)
    assert len({p.path_address for p in paths}) == len(paths)
    for p in paths:
        back = default.reverse(p)
        assert back.hops == p.reverse_hops()
        assert p.path_address in default.host_prefix(p.src)
        assert p.path_address != default.mrc_address(p.src)
    assert len(default.paths("h0", "h3")) == 8
    assert len(default.paths("h0", "h1")) == 4


def test_addresses_unique(default: topology.Topology) -> None:
    addrs = [a for lk in default.links() for a in (lk.a_addr, lk.b_addr)]
    addrs += [default.mrc_address(h) for h in default.host_names()]
    addrs += [p.path_address for p in default.paths()]
    assert len(addrs) == len(set(addrs))
    macs = [m for lk in default.links() for m in (lk.a_mac, lk.b_mac)]
    assert len(macs) == len(set(macs))
    assert default.port_address("h1", 2) == default.link_between("h1", "p2l0").a_addr


def test_expected_reachable(default: topology.Topology) -> None:
    down = frozenset({frozenset({"p0l0", "p0s1"})})
    hit = [p for p in default.paths() if not default.expected_reachable(p, down)]
    assert hit and all(p.plane == 0 and p.spine == 1 for p in hit)
    # every cross-leaf path from or to a host on leaf 0 through p0s1: 2 hosts x 2 remote hosts x 2 directions
    assert len(hit) == 8


def test_small_loads() -> None:
    t = topology.load(TOPOS / "small.toml")
    assert (t.planes, len(t.hosts), len(t.paths())) == (2, 2, 4)


def test_units() -> None:
    assert units.parse_rate("100mbit") == 100_000_000
    assert units.parse_rate("2.5gbit") == 2_500_000_000
    assert units.parse_rate(12345) == 12345
    assert units.parse_size("128KiB") == 131072
    assert units.parse_delay_us("2ms") == 2000
    assert topology.format_rate(200_000_000) == "200mbit"
    for bad in ("fast", "-3mbit", 0, True):
        with pytest.raises(ValueError):
            units.parse_rate(bad)


def test_a_delay_is_whole_microseconds_and_says_so() -> None:
    """A topology keeps delays in whole microseconds: "0.5us" was rounded to 0 without a word, and
    "500ns" (the simulator's default link delay) was an unknown unit. Nanoseconds are a unit now; a
    fraction of a microsecond is refused, naming the value."""
    assert units.parse_delay_us("3000ns") == 3 and units.parse_delay_us("1.5ms") == 1500
    for bad in ("0.5us", "500ns", "1.0001ms"):
        with pytest.raises(ValueError, match="whole microseconds"):
            units.parse_delay_us(bad)


BASE = """
[topology]
planes = 2
leaves = 2
spines = 1
[[hosts]]
name = "a"
leaf = 0
[[hosts]]
name = "b"
leaf = 1
"""

LO = '[[link_override]]\na = "p0l0"\n'


@pytest.mark.parametrize(("text", "key", "line", "problem"), [
    (BASE + "\n[link]\nspeed = 3\n", "link.speed", 14, "unknown key"),
    (BASE.replace("spines = 1\n", ""), "topology.spines", 2, "missing field"),  # its table's header
    (BASE.replace('name = "b"\nleaf = 1', 'name = "b"\nleaf = 5'), "hosts[1].leaf", 11, "does not exist"),
    (BASE.replace('name = "b"', 'name = "a"'), "hosts[1].name", 10, "duplicate"),
    (BASE.replace("spines = 1", "spines = 0"), "topology.spines", 5, "at least one spine"),
    (BASE.replace("planes = 2", "planes = 17"), "topology.planes", 3, "must be 1..16"),
    (BASE + '\n[link]\nrate = "fast"\n', "link.rate", 14, "not a rate"),
    (BASE + '\n[link]\nmtu = 9000\nbuffer = 4000\n', "link.buffer", 15, "cannot hold"),
    (BASE + '\n[addressing]\nmrc_prefix = "fcbb:bbbb::/48"\n', "addressing.mrc_prefix", 14, "address clash"),
    (BASE + '\n[addressing]\nusid_block = "fcbb::/16"\n', "addressing.usid_block", 14, "must be a /32"),
    (BASE + '\n[addressing]\nlink_prefix = "nonsense"\n', "addressing.link_prefix", 14,
     "not an IPv6 prefix"),
    ("extra = 1\n" + BASE, "extra", 1, "unknown key"),
    (BASE.replace('name = "a"', 'name = "p0l1"'), "hosts[0].name", 7, "looks like a switch"),
    (BASE + LO + 'b = "p1s0"\nrate = "1gbit"\n', "link_override[0]", 12, "no link between"),
    (BASE + LO + 'b = "p0s0"\n', "link_override[0]", 12, "neither rate nor delay"),
    (BASE + LO + 'b = "p0s0"\nrate = "slow"\n', "link_override[0].rate", 15, "not a rate"),
    (BASE + LO + 'b = "p0s0"\nrate = 1000\n[[link_override]]\na = "p0s0"\nb = "p0l0"\nrate = 2000\n',
     "link_override[1]", 16, "a second override"),
    (BASE + LO + 'c = 1\n', "link_override[0].c", 14, "unknown key"),
    ("link_override = 3\n" + BASE, "link_override", 1, "array of tables"),
])
def test_bad_files_name_file_line_key_problem(tmp_path: Path, text: str, key: str, line: int,
                                               problem: str) -> None:
    """Every semantic error reads FILE:LINE: key: problem, the line being the key's (a missing field:
    its table's header; an entry of an array of tables: its [[...]] header)."""
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        topology.load(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}:{line}: {key}: "), msg
    assert problem in msg, msg


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    f = tmp_path / "x.toml"
    f.write_text("# a comment\n[topology\n")
    with pytest.raises(ConfigError, match=r"x\.toml:2: not valid TOML: .* \(column \d+\)$"):
        topology.load(f)
    with pytest.raises(ConfigError, match="cannot read"):
        topology.load(tmp_path / "missing.toml")


def test_state_roundtrip(default: topology.Topology) -> None:
    again = topology.from_dict(default.to_dict(), source="state")
    assert again.paths() == default.paths()
    assert again.link == default.link


def test_sizes_mean_the_same_bytes_in_files_and_commands() -> None:
    """One parser (mrc.units): `64K` in a topology file is `64K` on every mrcctl command."""
    from mrc.ctl.cmd_allreduce import parse_size as allreduce_size
    from mrc.ctl.cmd_sim import parse_size as sim_size

    for text, n in (("64K", 65536), ("64KB", 65536), ("64KiB", 65536), ("1.5M", 3 << 19), ("4096", 4096)):
        assert units.parse_size(text) == sim_size(text) == allreduce_size(text) == n
    assert units.parse_rate("1bps") == 8  # tc: bytes per second
    for bad in ("1.5", "0", "-1", "10 furlongs", True, 2.5):
        with pytest.raises(ValueError):
            units.parse_size(bad)


def test_more_than_256_hosts_get_node_ids_of_their_own_and_the_first_256_keep_theirs() -> None:
    small = topology.generate(2, 8, 8, 8)  # 64 hosts
    big = topology.generate(2, 64, 16, 16)  # 1024 hosts
    assert [small.node_usid(f"h{i}", 1) for i in range(64)] == [big.node_usid(f"h{i}", 1) for i in range(64)]
    assert big.node_usid("h3", 1) == 0x1303 and big.node_usid("h300", 1) == 0x192C
    ids = [big.node_usid(n, p) for n, _ in big.hosts for p in range(2)] + [big.node_usid(s.name)
                                                                          for s in big.switches()]
    assert len(ids) == len(set(ids)) == 2 * 1024 + 2 * (64 + 16)
    assert all(i >> 12 == p for n, _ in big.hosts for p in range(2) for i in [big.node_usid(n, p)])
    # the paths of a host beyond 256 end in its own port
    (path,) = [p for p in big.paths("h0", "h1000") if p.plane == 1 and p.spine == 3]
    assert path.usids[-1] == big.node_usid("h1000", 1) and path.usids[-1] & 0xF00 >= 0x800
    with pytest.raises(ConfigError, match=r"need 2\.\.2048 hosts"):
        topology.generate(1, 129, 16, 16)


def test_bare_example_names_resolve_to_the_shipped_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`mrcctl testbed up small.toml` and `sim fluid --cluster cluster-8k.toml` from any directory (and
    from a wheel, where deploy/ is not at hand) take the shipped examples; a file of that name in the
    working directory wins, and a path with a directory, or a name nothing has, is left as given."""
    monkeypatch.chdir(tmp_path)
    shipped = topology.default_topology_dir()
    assert topology.example_path("small.toml") == shipped / "small.toml"
    assert topology.example_path("cluster-8k.toml", "cluster") == shipped / "cluster" / "cluster-8k.toml"
    assert topology.example_path("nope.toml") == Path("nope.toml")
    assert topology.example_path("sub/small.toml") == Path("sub/small.toml")
    (tmp_path / "small.toml").write_text("# mine\n")
    assert topology.example_path("small.toml") == Path("small.toml")
