"""Fixtures for the eBPF dataplane tests (root): each program is compiled once per session; state
records and pins of this session live in private places (a temporary run dir, a unique pin folder), so
neither an operator's dataplane nor a parallel run is touched; everything is removed at the end, also
when a test fails."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from mrc import topology
from mrc.dataplane import bpf
from mrc.dataplane import testbed as tb
from mrc.dataplane.fabric import FabricDataplane

ROOT = Path(__file__).resolve().parents[2]
TOPOS = ROOT / "deploy" / "topologies"


@pytest.fixture(scope="session", autouse=True)
def private_state(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    if os.geteuid() != 0:
        yield {}
        return
    env = {"MRC_RUN_DIR": str(tmp_path_factory.mktemp("mrc-run")),
           "MRC_BPF_PIN_ROOT": f"/sys/fs/bpf/mrc-test-{secrets.token_hex(4)}"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield env
    bpf.close_all()
    bpf.detach_everything()
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def programs(private_state: dict[str, str]) -> Iterator[dict[str, bpf.Program]]:
    """The three programs, compiled and loaded once for the whole session."""
    if os.geteuid() != 0:
        pytest.skip("needs root: loads eBPF programs")
    try:
        import bcc  # noqa: F401
    except ImportError:
        pytest.skip("BCC (python3-bpfcc) is not importable")
    try:
        progs = {k: bpf.program(k) for k in bpf.PROGRAMS}
    except OSError as e:
        # only a missing kernel feature is a reason to skip; any other refusal is a bug in our programs
        if any(m in str(e) for m in ("cannot use helper", "unknown func")):
            pytest.skip(f"the kernel lacks a helper the programs need: {e}")
        raise
    yield progs
    for p in progs.values():
        p.close()


def new_name() -> str:
    return "d" + secrets.token_hex(4)


@pytest.fixture(scope="module")
def small_fabric(programs: dict[str, bpf.Program]) -> Iterator[FabricDataplane]:
    """small.toml (h0 and h1 on different leaves, 2 planes, 1 spine) with all three programs attached."""
    name = new_name()
    try:
        tb.up(topology.load(TOPOS / "small.toml"), name=name, source="small.toml")
        fabric = FabricDataplane.attach(name)
        yield fabric
        fabric.detach()
    finally:
        tb.teardown(name)
