"""The emulated real machines of tests/netns/machines.sh (root): the fabric works without mrcd, every
configuration file it writes is valid for mrc.hostconfig and names every plane and peer, every micro-SID
path a Clos file lists answers through exactly the spine it names, a failed cable takes down exactly
its paths and `link ... up` repairs it, and nothing is left behind (also after an interrupted `up`).

back to back (b2b): mA and mB, eth1..eth4 cabled port to port (4 planes)
clos: mA, mB on leaf 0 and mC, mD on leaf 1 of two planes of 2 leaves + 2 spines (kernel SRv6 End with
NEXT-C-SID on the switches); eth1 is plane 0, eth2 plane 1. Diagrams and numbering: machines.sh.
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from machines import SCRIPT, Machine, Machines, machines, skip_reason

from mrc.hostconfig import describe, load

pytestmark = [pytest.mark.root(reason="builds network namespaces"), pytest.mark.netns]

# probes `machines.sh check` makes: b2b 4 planes x 2 directions; clos per plane 4 cross-leaf pairs x 2
# spines + 2 same-leaf pairs, each both ways
CHECKS = {"b2b": 8, "clos": 2 * (4 * 2 + 2) * 2}
PLANES = {"b2b": 4, "clos": 2}
MACHINES = {"b2b": 2, "clos": 4}


@pytest.fixture(autouse=True)
def _can_run() -> None:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)


def namespaces_with(suffix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    return [n for n in names if n.endswith(f"-{suffix}")]


def leaf(m: Machine) -> int:
    return "ABCD".index(m.letter) // 2


def assert_config(ms: Machines, m: Machine) -> list[str]:
    """`m`'s file loads, says what machines.sh built, and `describe` names every plane and peer; returns
    its paths as "<plane> <src> -> <dst> <container>"."""
    cfg = load(m.config)
    lines = describe(cfg)
    assert cfg.name == m.name and cfg.mrc_address == m.mrc_address and cfg.socket == m.socket
    assert cfg.metrics is not None and f"[{cfg.metrics[0]}]:{cfg.metrics[1]}" == m.metrics
    assert cfg.fabric.shape == {"b2b": "back-to-back", "clos": "clos"}[ms.shape]
    assert [p.interface for p in cfg.planes] == list(m.ports)
    assert [p.address for p in cfg.planes] == list(m.addresses)
    assert [p.gateway for p in cfg.planes if p.gateway is not None] == list(m.gateways)
    for p in cfg.planes:
        assert any(x.startswith(f"plane {p.index}: interface {p.interface}: address {p.address}")
                   for x in lines), lines
    others = [o for o in ms if o is not m]
    assert sorted(cfg.peer_names()) == sorted(o.name for o in others)
    paths = []
    for o in others:
        peer = cfg.peer(o.name)
        assert peer.mrc_address == o.mrc_address
        assert any(x.startswith(f"peer {o.name}: MRC address {o.mrc_address}") for x in lines), lines
        for n, pp in enumerate(peer.planes):
            assert pp.address == o.addresses[n].ip
            assert any(x.startswith(f"  plane {n} -> {pp.address}") for x in lines), lines
            if ms.shape == "clos":
                assert len(pp.paths) == (1 if leaf(o) == leaf(m) else 2)
                assert all(s.usids[-1] == int(f"{n}3{'ABCD'.index(o.letter):02x}", 16) for s in pp.paths)
                paths += [f"plane {n} {m.label} -> {o.label} via {s.container}" for s in pp.paths]
            else:
                assert not pp.paths
    return paths


def proved_paths(passed: tuple[str, ...]) -> set[str]:
    """ "clos plane 0 mA -> mC via p0s1 fcbb:bbbb:100:201:101:302:: (...)" -> "plane 0 mA -> mC via
    fcbb:bbbb:100:201:101:302::" """
    out = set()
    for line in passed:
        w = line.split()
        if w[0] == "clos":
            out.add(f"plane {w[2]} {w[3]} -> {w[5]} via {w[8]}")
    return out


@pytest.fixture
def clos() -> Iterator[Machines]:
    with machines("clos") as ms:
        yield ms


@pytest.mark.parametrize("shape", ["b2b", "clos"])
def test_up_check_down(shape: str) -> None:
    with machines(shape) as ms:
        suffix, directory = ms.suffix, ms.dir
        assert len(ms.machines) == MACHINES[shape]
        assert set(namespaces_with(suffix)) == set(ms.namespaces())
        assert len(ms.switches) == (8 if shape == "clos" else 0)
        configured = []
        for m in ms:
            assert len(m.ports) == PLANES[shape]
            for port in m.ports:
                link = subprocess.run(["ip", "-n", m.netns, "link", "show", port], capture_output=True,
                                      text=True, check=True).stdout
                assert "mtu 9000" in link and "state UP" in link, link
            configured += assert_config(ms, m)
        result = ms.check()
        assert result.ok, "\n".join(result.failed) or result.summary
        assert len(result.passed) == CHECKS[shape]
        assert result.summary == f"check: {CHECKS[shape]} passed, 0 failed"
        # every path a file lists is one that check proved (through the spine it names, by its counters)
        assert set(configured) <= proved_paths(result.passed), (configured, result.passed)
        assert len(configured) == (CHECKS[shape] if shape == "clos" else 0)
    assert namespaces_with(suffix) == []
    assert not directory.exists()


def test_clos_link_failure_and_repair(clos: Machines) -> None:
    clos.link("p0s0", "to-l0", "down")
    broken = clos.check()
    assert not broken.ok
    # exactly the plane-0 paths through spine 0 between the leaves, both ways: 4 pairs x 2
    assert len(broken.failed) == 8, broken.failed
    assert all(x.startswith("clos plane 0 ") and " via p0s0 " in x for x in broken.failed)
    clos.link("p0s0", "to-l0", "up")
    repaired = clos.check()
    assert repaired.ok, "\n".join(repaired.failed)


def test_down_twice_and_without_state() -> None:
    with tempfile.TemporaryDirectory(prefix="mrcm-", dir="/tmp") as d:
        assert run("down", d).returncode == 0  # nothing was ever up there
        up = run("up", "b2b", d)
        assert up.returncode == 0, up.stderr
        suffix = (Path(d) / "env").read_text().split("SUFFIX=")[1].split()[0]
        assert len(namespaces_with(suffix)) == 2
        assert run("down", d).returncode == 0
        assert run("down", d).returncode == 0
        assert namespaces_with(suffix) == []
        assert list(Path(d).iterdir()) == []
    assert run("down", "/tmp/mrcm-no-such-dir").returncode == 0


def test_interrupted_up_leaves_nothing() -> None:
    with tempfile.TemporaryDirectory(prefix="mrcm-", dir="/tmp") as d:
        proc = subprocess.Popen(["bash", str(SCRIPT), "up", "clos", d], stderr=subprocess.PIPE, text=True)
        assert proc.stderr is not None
        first = proc.stderr.readline()  # "up clos: suffix XXXX, ...": it is building now
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=60)[1]
        assert proc.returncode == 143, first + rest
        assert "up did not finish" in rest
        suffix = first.split("suffix ")[1].split(",")[0]
        assert namespaces_with(suffix) == []
        assert list(Path(d).iterdir()) == []


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120,
                          check=False)
