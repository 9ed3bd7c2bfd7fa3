"""The `mrc` torch.distributed backend over MRC (root): two emulated machines, h0 and h1 of default.toml
with their mrcds (test_daemon.py's fixture), one torchrun launcher each (`--nnodes 2 --nproc-per-node 2
--rdzv-backend c10d`, rendezvous on 127.0.0.1), ranks 0-1 on h0 and 2-3 on h1 in the root namespace,
each talking to its host's mrcd (node 0 names it by MRC_SOCKET, node 1 by MRC_HOST). The rank script
(tests/unit/_torch_backend_worker.py) says `init_process_group("mrc")` and imports nothing from mrc.

Checked: every collective bit-identical to gloo's in the same job (all_reduce of integer-valued float32
tensors up to 1M + 3 elements, i.e. several ring pieces; AVG / MIN / MAX / PRODUCT, int64, float64, a
non-contiguous tensor; broadcast from every root; all_gather, all_gather_into_tensor,
reduce_scatter_tensor, barrier, a sub-group across the hosts), random floats close; DDP's loss within 5%
of gloo's at every step and its parameters identical across ranks, also with mrc_hook (4-bit) over the
group's transport; bytes crossed MRC (ranks 1 and 3 are the ring's hops between the
hosts, and each host's egress program counted at least what its ranks sent that way). And: node 1
pointed at a socket with no mrcd fails the whole job with an error naming that socket, not a hang.
Every launcher and rank is ended by PID on every exit path (tests/unit/_torchrun_jobs.py).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.srv6, pytest.mark.root(reason="namespaces, eBPF programs, daemons"),
              pytest.mark.netns, pytest.mark.bpf]

pytest.importorskip("torch", reason="torch is not importable (make setup installs torch==2.13.0)")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from _torchrun_jobs import Job  # noqa: E402
from test_daemon import tb  # noqa: E402,F401  (the module-scoped testbed + mrcd fixture)

from mrc.dataplane.client import MrcClient, socket_path  # noqa: E402

SIZES = "1,7,1000,65537,1048576,1048579"
STEPS = 10


def _tx_bytes(bed: dict[str, Any], host: str) -> int:
    """Bytes the host's egress program sent, all planes (mrcd `stats`)."""
    with MrcClient.for_host(bed["tb"].ns(host)) as c:
        st = c.call("stats")
    return sum(int(row.get("tx_bytes", 0)) for row in st["dataplane"]["planes"].values())


@pytest.mark.timeout(1200)
def test_torchrun_on_two_machines_matches_gloo(tb: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    t0 = time.monotonic()
    nodes = [{"MRC_SOCKET": str(socket_path(tb["tb"].ns("h0")))}, {"MRC_HOST": tb["tb"].ns("h1")}]
    tx0 = {h: _tx_bytes(tb, h) for h in ("h0", "h1")}
    with Job(tmp_path / "job", nodes, 2, {"MRC_TEST_SIZES": SIZES, "MRC_TEST_STEPS": str(STEPS),
                                          "MRC_TEST_TIMEOUT": "300"}) as job:
        rcs = job.wait(900)
        res = job.results()
        tail = job.log_tail()
    took = time.monotonic() - t0
    assert not job.rank_pids() and not job.launcher_pids()
    tx1 = {h: _tx_bytes(tb, h) for h in ("h0", "h1")}
    assert rcs == [0, 0], tail
    assert sorted(res) == [0, 1, 2, 3], tail
    for r, d in res.items():
        assert d["ok"], (r, d.get("error"), d.get("traceback"))
    assert "sub_group_all_reduce" in res[1]["identical"] and "sub_group_all_reduce" in res[2]["identical"]
    # placement: torchrun's node with ranks 0-1 is one machine, 2-3 the other
    hosts = res[0]["hosts"]
    assert all(d["hosts"] == hosts for d in res.values())
    assert sorted(hosts) == ["h0", "h0", "h1", "h1"] and hosts[0] == hosts[1] and hosts[2] == hosts[3]
    for d in res.values():
        assert d["backend"] == "mrc" and d["pg_type"] == "MrcProcessGroup"
        assert all(d["identical"].values()), {k: v for k, v in d["identical"].items() if not v}
        assert d["close"]["all_reduce_random"] < 1e-5
        assert "integer or bool tensors only" in d["errors"]["band_float"]
    n_identical = sum(len(d["identical"]) for d in res.values())
    # MRC carried the ring's hops between the machines (rank 1 -> 2, rank 3 -> 0), shared memory the others
    mrc = {r: d["stats"]["mrc_bytes"] for r, d in res.items()}
    local = {r: d["stats"]["local_bytes"] for r, d in res.items()}
    assert mrc[0] == mrc[2] == 0 and mrc[1] > 8 << 20 and mrc[3] > 8 << 20, mrc
    assert local[1] == local[3] == 0 and local[0] > 8 << 20 and local[2] > 8 << 20, local
    for host in ("h0", "h1"):
        sent = sum(mrc[r] for r in range(4) if hosts[r] == host)
        assert tx1[host] - tx0[host] >= sent, (host, tx1[host] - tx0[host], sent)
    # DDP on the mrc group tracks DDP on gloo; every replica ends with the same parameters
    m, g = res[0]["ddp_mrc"]["losses"], res[0]["ddp_gloo"]["losses"]
    assert len(m) == len(g) == STEPS
    gaps = [abs(a - b) / b for a, b in zip(m, g, strict=True)]
    assert max(gaps) < 0.05, gaps
    assert m[-1] < m[0], "the model trains at all"
    assert len({d["ddp_mrc"]["params_sha256"] for d in res.values()}) == 1
    # mrc's compressed hook (4-bit EDEN, 2 warm-up iterations) over the mrc group's own transport
    hooked = res[0]["ddp_hook"]["losses"]
    hook_gaps = [abs(a - b) / b for a, b in zip(hooked, g, strict=True)]
    assert max(hook_gaps) < 0.05, hook_gaps
    assert all(d["ddp_hook"]["hook_messages"] == 2 * 3 * (STEPS - 2) for d in res.values())
    assert len({d["ddp_hook"]["params_sha256"] for d in res.values()}) == 1
    worst = max(d["close"]["all_reduce_random"] for d in res.values())
    d0 = res[0]
    print(f"\ntorchrun 2 machines x 2 ranks over MRC: {n_identical} bit-identical checks against gloo "
          f"(all passed), random-float all_reduce max rel. diff {worst:.1e}; DDP {STEPS} steps: max "
          f"per-step loss gap {max(gaps):.2e} (mrc {m[0]:.4f} -> {m[-1]:.4f}, gloo {g[0]:.4f} -> "
          f"{g[-1]:.4f}); with mrc_hook 4-bit {max(hook_gaps):.2%}; "
          f"MRC bytes per rank {mrc}; all_reduce section {d0['all_reduce_s']:.2f} s, barrier "
          f"{d0['barrier_s'] * 1e3:.1f} ms, DDP mrc {d0['ddp_mrc']['time_s']:.2f} s (construction "
          f"{d0['ddp_mrc']['init_s']:.2f} s) vs gloo {d0['ddp_gloo']['time_s']:.2f} s; job {took:.1f} s")

@pytest.mark.timeout(600)
def test_a_machine_without_mrcd_fails_the_job_with_a_clear_error(tb: dict[str, Any],  # noqa: F811
                                                                  tmp_path: Path) -> None:
    missing = tmp_path / "no-mrcd-here.sock"
    t0 = time.monotonic()
    nodes = [{"MRC_SOCKET": str(socket_path(tb["tb"].ns("h0")))}, {"MRC_SOCKET": str(missing)}]
    with Job(tmp_path / "job", nodes, 2, {"MRC_TEST_TIMEOUT": "900"}) as job:
        rcs = job.wait(400)
        res = job.results()
        tail = job.log_tail()
    took = time.monotonic() - t0
    assert not job.rank_pids() and not job.launcher_pids()
    assert all(rc not in (None, 0) for rc in rcs), (rcs, tail)
    assert took < 300, f"{took:.0f} s: the job waited instead of failing"
    assert res, tail
    for d in res.values():
        assert not d["ok"]
        # the ranks of node 1 name their socket; those of node 0 say which peer could not start, and why
        assert str(missing) in d["error"], d["error"]
        assert "start mrcd" in d["error"] or "a peer could not start" in d["error"], d["error"]
    print(f"\nmachine without mrcd: the job failed in {took:.1f} s; "
          + "; ".join(f"rank {r}: {d['error'][:160]}" for r, d in sorted(res.items())))
