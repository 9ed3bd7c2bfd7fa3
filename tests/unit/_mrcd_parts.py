"""Real parts of mrcd for tests that need no kernel: the engine's path-map recorder and a `HostEngine` on
the default topology (imported by tests/unit/conftest.py and test_metrics_exporter.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mrc import topology
from mrc.ctl.host_engine import HostEngine

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
