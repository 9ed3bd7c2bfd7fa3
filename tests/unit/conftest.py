"""Fixtures shared by the tests of mrcd's parts: a real `HostEngine` (the default topology's h0, a real
engine and controller) whose BPF side is a recorder, and its `Operations`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mrc import topology
from mrc.ctl.host_engine import HostEngine
from mrc.ctl.operations import Operations

ROOT = Path(__file__).resolve().parents[2]


class PathRecorder:
    """The engine's `PathWriter` without a kernel: what would be in the path and allowed-QP maps."""

    def __init__(self) -> None:
        self.paths: dict[tuple[str, int], Any] = {}
        self.allowed: set[int] = set()

    def set_path(self, peer: str, ev: int, path: Any) -> None:
        self.paths[(peer, ev)] = path

    def delete_path(self, peer: str, ev: int) -> None:
        self.paths.pop((peer, ev), None)

    def allow_qp(self, qpn: int) -> None:
        self.allowed.add(qpn)

    def disallow_qp(self, qpn: int) -> None:
        self.allowed.discard(qpn)


def host_engine(evs: int = 64) -> HostEngine:
    topo = topology.load(ROOT / "deploy" / "topologies" / "default.toml")
    return HostEngine(topo, "h0", PathRecorder(), lambda lk, state: None, evs=evs)


@pytest.fixture
def make_ops() -> Callable[..., Operations]:
    """Operations (or a subclass of it) over a fresh engine."""

    def make(cls: type[Operations] = Operations) -> Operations:
        e = host_engine()
        ifnames = [f"eth{p + 1}" for p in range(e.planes)]
        return cls(e, site="tb", port_ifname=ifnames, link_rate_bps=10**8)

    return make


@pytest.fixture
def mrcd_ops(make_ops: Callable[..., Operations]) -> Operations:
    return make_ops()
