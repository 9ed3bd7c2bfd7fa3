"""mrcd on a real host resolves each plane's next hop by neighbour discovery: a link-local gateway
written with its scope (``fe80::1%eth1``, which docs/deploy.md allows) must be found in the kernel's
neighbour table, whose entries carry no scope."""

from __future__ import annotations

import ipaddress
from typing import Any

from mrc.dataplane import host as hostmod
from mrc.dataplane.host import HostDataplane, Port


class _Neigh(dict[str, Any]):
    def __init__(self, dst: str, mac: str) -> None:
        super().__init__(state=0x02)  # NUD_REACHABLE
        self.attrs = {"NDA_DST": dst, "NDA_LLADDR": mac}

    def get_attr(self, name: str) -> Any:
        return self.attrs.get(name)


class _Ipr:
    def get_neighbours(self, family: int, ifindex: int) -> list[_Neigh]:
        return [_Neigh("fe80::1", "02:00:00:00:00:01"), _Neigh("fc00::9", "02:00:00:00:00:09")]


def test_a_scoped_link_local_next_hop_resolves(monkeypatch: Any) -> None:
    poked: list[str] = []
    monkeypatch.setattr(hostmod, "_poke", lambda port, hop: poked.append(hop))
    port = Port(0, "eth1", 7, "02:00:00:00:00:aa", ipaddress.IPv6Interface("fc00::2/64"), 10**9)
    port.unresolved = {"fe80::1%eth1", "fc00::9", "fc00::7"}
    dp = HostDataplane.__new__(HostDataplane)
    dp.ports = [port]
    dp._poked = {}
    found = dp._ask(_Ipr())
    assert sorted(h for _, h in found) == ["fc00::9", "fe80::1%eth1"]  # was ["fc00::9"]: waited for ever
    assert port.next_hop_mac["fe80::1%eth1"] == "02:00:00:00:00:01"
    assert port.unresolved == {"fc00::7"} and poked == ["fc00::7"]


class _Link(dict[str, Any]):
    def __init__(self, index: int, name: str, mac: str) -> None:
        super().__init__(index=index)
        self.attrs = {"IFLA_IFNAME": name, "IFLA_ADDRESS": mac}

    def get_attr(self, name: str) -> Any:
        return self.attrs.get(name)


class _Links:
    def get_links(self) -> list[_Link]:
        return [_Link(1, "lo", "00:00:00:00:00:00"), _Link(2, "eth1", "02:00:00:00:01:01")]


def test_a_missing_port_is_named_with_its_file_line_and_key() -> None:
    """A plane whose interface this host lacks is a configuration error like any other (exit code 2),
    named by the file, the line and the key of its selector (it said ``plane[1] (interface eth2)``, no
    line, and mrcd exited 1); the key is the table's position in the file, not the plane's index."""
    import pytest

    from mrc import hostconfig

    text = """\
[host]
name = "a"
mrc_address = "fd00::a"

[[plane]]
index = 1
interface = "eth2"
address = "fc00:2::a/64"

[[plane]]
index = 0
interface = "eth1"
address = "fc00:1::a/64"

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
    cfg = hostconfig.loads(text, "a.toml")
    with pytest.raises(hostconfig.HostConfigError) as e:
        hostmod.find_ports(cfg, _Links(), lambda _m: None)
    assert str(e.value) == ("a.toml:7: plane[0].interface: interface eth2: no such network interface here "
                            "(interfaces: eth1)")
    assert e.value.exit_code == 2
