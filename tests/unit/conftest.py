"""Fixtures shared by the tests of mrcd's parts: a real `HostEngine` (the default topology's h0, a real
engine and controller) whose BPF side is a recorder, and its `Operations`."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from mrc.ctl.operations import Operations

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mrcd_parts import host_engine


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
