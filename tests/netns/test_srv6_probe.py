"""The testbed's check of the kernel's SRv6 (`testbed.srv6_gap`): on a kernel without SRv6 routes
`testbed up` failed on its first seg6 route with a bare NetlinkError (95, 'Operation not supported'), and
every test that builds a testbed errored the same way; now the build is refused up front, naming what is
missing, and those tests are skipped with that reason (the `srv6` marker, tests/conftest.py)."""

from __future__ import annotations

import secrets

import pytest

from mrc import topology
from mrc.dataplane import netns
from mrc.dataplane import testbed as tb
from mrc.errors import MrcError

pytestmark = [pytest.mark.root(reason="builds network namespaces"), pytest.mark.netns]


def test_the_probe_answers_and_leaves_nothing_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    before = set(netns.listing())
    monkeypatch.setattr(tb, "_SRV6_GAP", [])  # probe afresh
    gap = tb.srv6_gap()
    assert gap is None or "SRv6" in gap or "NEXT-C-SID" in gap
    assert set(netns.listing()) == before
    assert tb.srv6_gap() == gap  # once per process


def test_up_on_a_kernel_without_srv6_names_it_and_builds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    why = "this kernel has no SRv6 routes (built without CONFIG_IPV6_SEG6_LWTUNNEL)"
    monkeypatch.setattr(tb, "_SRV6_GAP", [why])
    name = "p" + secrets.token_hex(4)
    topo = topology.Topology(planes=1, leaves=1, spines=0, hosts=(("a", 0), ("b", 0)))
    before = set(netns.listing())
    with pytest.raises(MrcError, match="CONFIG_IPV6_SEG6_LWTUNNEL"):
        tb.up(topo, name=name)
    assert set(netns.listing()) == before
    assert not tb.Testbed.path_for(name).exists()


def test_a_probe_that_cannot_make_a_namespace_is_a_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no namespace can be made (no CAP_SYS_ADMIN in a container, /run/netns unwritable) the
    probe answers with the reason instead of raising: the suite's collection (tests/conftest.py) must
    not fail on it."""

    def refuse(name: str) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(tb, "_SRV6_GAP", [])
    monkeypatch.setattr(netns, "create", refuse)
    gap = tb.srv6_gap()
    assert gap is not None and "Operation not permitted" in gap
