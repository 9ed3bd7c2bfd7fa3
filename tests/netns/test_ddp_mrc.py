"""DDP over MRC on default.toml (root): 2 and 4 DDP rank processes (gloo process group on 127.0.0.1, one per
testbed host) train the same small model with plain DDP and with `mrc_hook` at 4-bit unbiased EDEN whose
compressed ring runs over `MrcTransport` (WRITE-with-immediate through each host's mrcd).

Tolerance as tests/unit/test_ddp_hook.py: at every step the hooked loss within 5% of plain DDP's, the
mean of the last 20 steps within 2%. And: the same hook over the process group itself (gloo p2p) gives
bit-identical losses and parameters (the ring is deterministic given its seeds); the compressed buckets
crossed MRC (every rank posted its 2 (n - 1) messages per compressed iteration through its transport,
and its host's egress program counted at least those bytes leaving); the parameters are bit-identical
across ranks after training; no rank process is left (they are ended by PID on every exit path), also
when one of them died (training then fails with an error instead of hanging). The testbed and daemons
come from test_daemon.py's fixture (removed at the end, also on failure).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.srv6, pytest.mark.root(reason="namespaces, eBPF programs, daemons"),
              pytest.mark.netns, pytest.mark.bpf]

pytest.importorskip("torch", reason="torch is not importable (make setup installs torch==2.13.0)")

from rank_procs import rank_pids  # noqa: E402
from test_daemon import tb  # noqa: E402,F401  (the module-scoped testbed + mrcd fixture)

from mrc.ctl.ddp_rank import DdpRanks  # noqa: E402
from mrc.dataplane.client import MrcClient  # noqa: E402
from mrc.errors import MrcError  # noqa: E402

STEPS = 60
START_ITER = 2


def _tx_bytes(bed: dict[str, Any], host: str) -> int:
    """Bytes the host's egress program sent, all planes (mrcd `stats`)."""
    with MrcClient.for_host(bed["tb"].ns(host)) as c:
        st = c.call("stats")
    return sum(int(row.get("tx_bytes", 0)) for row in st["dataplane"]["planes"].values())


@pytest.mark.parametrize("ranks", [2, 4])
def test_ddp_over_mrc_tracks_uncompressed(tb: dict[str, Any], ranks: int) -> None:  # noqa: F811
    t_start = time.monotonic()
    hosts = tb["tb"].topo.host_names()[:ranks]
    group = DdpRanks(tb["name"], ranks, timeout_s=60)
    try:
        base = group.train(hook=False, steps=STEPS)
        tx0 = {h: _tx_bytes(tb, h) for h in hosts}
        hooked = group.train(hook=True, transport="mrc", steps=STEPS, bits=4, scheme="eden-unbiased",
                             partial_sums="aware", seed=7, start_iter=START_ITER)
        tx1 = {h: _tx_bytes(tb, h) for h in hosts}
        # the same hook and seeds over the process group itself (gloo p2p, TorchTransport)
        over_gloo = group.train(hook=True, transport="gloo", steps=STEPS, bits=4, scheme="eden-unbiased",
                                partial_sums="aware", seed=7, start_iter=START_ITER)
    finally:
        group.close()
    # every rank process is gone, ended through the launcher
    assert all(p.poll() is not None for p in group.procs)
    assert not rank_pids(tb["name"], "mrc.ctl.ddp_rank")
    assert not group.rundir.exists()

    assert base["params_identical"] and hooked["params_identical"]
    b, h = base["ranks"][0]["losses"], hooked["ranks"][0]["losses"]
    assert all(a["losses"] == h for a in hooked["ranks"]), "the global loss is one number per step"
    assert len(b) == len(h) == STEPS
    rel = [abs(y - x) / x for x, y in zip(b, h, strict=True)]
    tail = sum(h[-20:]) / sum(b[-20:])
    assert max(rel) < 0.05, rel
    assert abs(tail - 1) < 0.02, tail
    assert b[-1] < 0.5 * b[0], "the model trains at all"
    assert any(r > 0 for r in rel[START_ITER:]), "compression changed nothing: the hook did not take effect"

    # the compressed buckets went over MRC: one bucket per iteration, 2 (n - 1) messages per rank each
    compressed = STEPS - START_ITER
    for r, (host, a) in enumerate(zip(hosts, hooked["ranks"], strict=True)):
        assert a["iters"] == STEPS
        assert a["messages"] == 2 * (ranks - 1) * compressed, (r, a["messages"])
        assert a["wire_bytes"] > 0
        # what left the host's egress program (headers included) holds at least the rank's messages
        assert tx1[host] - tx0[host] >= a["wire_bytes"], (host, tx1[host] - tx0[host], a["wire_bytes"])
    # the ring is deterministic given its seeds: over MRC the same bytes and floats as over gloo
    for a, g in zip(hooked["ranks"], over_gloo["ranks"], strict=True):
        assert a["losses"] == g["losses"] and a["params_sha256"] == g["params_sha256"]
        assert a["wire_bytes"] == g["wire_bytes"] and g["messages"] == 0
    # plain DDP never touched MRC
    assert all(a["messages"] == 0 and a["wire_bytes"] == 0 for a in base["ranks"])
    # 4 bits per coordinate plus headers: well under the float32 bucket's 2 (n - 1) / n x 4 x params
    params = 16 * 64 + 64 + 64 + 1
    assert hooked["ranks"][0]["wire_bytes"] < 0.5 * compressed * 2 * (ranks - 1) / ranks * 4 * params

    print(f"\nDDP over MRC, {ranks} ranks, {STEPS} steps: max per-step loss gap {max(rel):.4%}, "
          f"last-20 ratio {tail:.4f}; wire bytes per rank {[a['wire_bytes'] for a in hooked['ranks']]}, "
          f"egress bytes {[tx1[x] - tx0[x] for x in hosts]}; "
          f"train time MRC {hooked['ranks'][0]['time_s']:.2f} s, plain {base['ranks'][0]['time_s']:.2f} s; "
          f"test body {time.monotonic() - t_start:.1f} s")


def test_cli_ddp_train(tb: dict[str, Any]) -> None:  # noqa: F811
    r = subprocess.run([sys.executable, "-m", "mrc.ctl.cli", "-j", "ddp", "train", "-n", tb["name"],
                        "--ranks", "2", "--steps", "12", "--bits", "4", "--timeout", "60"],
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["config"]["hosts"] == ["h0", "h1"] and doc["config"]["transport"] == "mrc"
    assert [s["step"] for s in doc["steps"]] == list(range(12))
    assert all(s["loss_ddp"] is not None for s in doc["steps"])
    assert doc["summary"]["params_identical"] and doc["summary"]["max_gap"] < 0.05
    assert doc["hooked"]["messages"] == [2 * (12 - START_ITER)] * 2
    assert doc["summary"]["wire_bytes"] == sum(doc["hooked"]["wire_bytes"]) > 0
    assert not rank_pids(tb["name"], "mrc.ctl.ddp_rank")


def test_a_dead_rank_fails_training_and_leaves_nothing(tb: dict[str, Any]) -> None:  # noqa: F811
    t0 = time.monotonic()
    group = DdpRanks(tb["name"], 2, timeout_s=10)
    try:
        os.kill(group.procs[1].pid, signal.SIGKILL)
        with pytest.raises(MrcError):
            group.train(steps=5)
    finally:
        group.close()
    assert all(p.poll() is not None for p in group.procs)
    assert not rank_pids(tb["name"], "mrc.ctl.ddp_rank")
    assert not group.rundir.exists()
    print(f"\ndead rank: {time.monotonic() - t0:.1f} s")
