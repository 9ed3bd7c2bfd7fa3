"""`mrcctl sim run allreduce`: the ring's real message sizes over the simulated fabric."""

from __future__ import annotations

import json

import pytest

from mrc.collective import Config
from mrc.ctl.cli import main
from mrc.sim import collective as scoll
from mrc.sim.experiments import FabricSpec, RunSpec


def test_message_sizes_are_the_collectives() -> None:
    msgs = scoll.message_sizes(4, 4096, Config("none"), 1)
    assert len(msgs) == 4 and all(len(m) == 6 for m in msgs)  # 2 (n - 1) ring steps, one segment each
    assert all([(s, seg) for s, seg, _ in m] == [(s, 0) for s in range(6)] for m in msgs)
    assert all(b == 1024 * 4 for m in msgs for _, _, b in m)  # a quarter of the buffer per step
    comp = scoll.message_sizes(4, 4096, Config("eden-unbiased", 2), 1)
    assert all(b < 1024 * 4 / 8 for m in comp for _, _, b in m)  # 2 bits instead of 32, plus headers


def test_segmented_chunks_carry_their_step_and_segment() -> None:
    """Chunks of 3 * 2^20 + 5 elements are 4 segments: one message per segment and ring step, and
    every message after the first step has its dependency (the left rank's same segment, one step
    earlier) in the recording."""
    n, chunk = 3, 3 * (1 << 20) + 5
    msgs = scoll.message_sizes(n, n * chunk, Config("none"), 1)
    for r in range(n):
        assert [(s, seg) for s, seg, _ in msgs[r]] == [(s, seg) for s in range(4) for seg in range(4)]
        assert [b for _, _, b in msgs[r]] == [4 << 20, 4 << 20, 4 << 20, 20] * 4
        left = {(s, seg) for s, seg, _ in msgs[(r - 1) % n]}
        assert all((s - 1, seg) in left for s, seg, _ in msgs[r] if s > 0)


def test_compressed_ring_is_faster_and_completes() -> None:
    spec = RunSpec(FabricSpec(planes=2, leaves=2, spines=2, hosts_per_leaf=2), variants=("mrc",))
    doc = scoll.run(spec, 4, 256 << 10, Config("eden-unbiased", 2, "aware"))
    r = doc["results"]["mrc"]
    assert r["compressed"]["completed"] and r["uncompressed"]["completed"]
    assert r["compressed"]["wire_bytes"] < r["uncompressed"]["wire_bytes"] / 8
    assert r["speedup"] > 1.5
    assert doc["config"]["hosts"] == [0, 1, 2, 3]  # 4 hosts, 4 ranks: one each


def test_cli(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["-j", "sim", "run", "allreduce", "--ranks", "2", "--size", "64K", "--planes", "2",
               "--spines", "2", "--hosts-per-leaf", "2", "--leaves", "2", "--variants", "mrc"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["experiment"] == "allreduce"
    assert doc["results"]["mrc"]["compressed"]["time_s"] > 0
    rc = main(["-j", "sim", "run", "allreduce", "--ranks", "99", "--planes", "2", "--spines", "2",
               "--hosts-per-leaf", "2", "--leaves", "2"])
    assert rc != 0 and "ranks" in json.loads(capsys.readouterr().out)["error"]
