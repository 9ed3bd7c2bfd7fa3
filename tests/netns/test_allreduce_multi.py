"""More than one rank per host over MRC on default.toml (root): 8 rank processes on the 4 hosts, two per
host, host-major (ranks 0, 1 on h0; 2, 3 on h1; ...). The ring's hops between host groups go through MRC
(WRITE-with-immediate through the hosts' mrcds, two rank processes sharing each mrcd), the hops inside a
host through shared memory (dataplane/intrahost.py).

Behaviour only: every rank ends with the same result, bit for bit the in-process ranks' result with the
same seeds (one BLAS thread on both sides), the same per-rank wire bytes, bytes went through MRC (each
host's egress program counted at least what its ranks posted through MRC) and through shared memory,
and no rank process is left afterwards, also when one of them dies mid-run. The testbed and daemons come
from test_daemon.py's fixture (removed at the end, also on failure).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytestmark = [pytest.mark.srv6, pytest.mark.root(reason="namespaces, eBPF programs, daemons"),
              pytest.mark.netns, pytest.mark.bpf]

from rank_procs import rank_pids  # noqa: E402
from test_daemon import tb  # noqa: E402,F401  (the module-scoped testbed + mrcd fixture)

from mrc.collective import Config  # noqa: E402
from mrc.collective.bench import make_inputs  # noqa: E402
from mrc.ctl.allreduce_mrc import MrcRunner  # noqa: E402
from mrc.dataplane.client import MrcClient  # noqa: E402
from mrc.errors import MrcError  # noqa: E402

SIZE = 2 << 20
RANKS = 8
ONE_BLAS_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
HOSTS = ["h0", "h1", "h2", "h3"]

# the in-process ranks (threads), in a process of their own with one BLAS thread, as the rank processes
REFERENCE = """
import sys
import numpy as np
from mrc.collective import Config, allreduce, run_inproc
from mrc.collective.bench import make_inputs
n, size, seed, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cfg = Config("eden-unbiased", 2.0, "aware", seed=seed)
xs = make_inputs(n, size // 4, "iid", seed, 0)
res = run_inproc(n, lambda t: allreduce(t, xs[t.rank], cfg, 0))
assert all(np.array_equal(r.out, res[0].out) for r in res)
np.save(out, res[0].out)
print(" ".join(str(r.wire_bytes) for r in res))
"""


def _tx_bytes(bed: dict[str, Any], host: str) -> int:
    """Bytes the host's egress program sent, all planes (mrcd `stats`)."""
    with MrcClient.for_host(bed["tb"].ns(host)) as c:
        st = c.call("stats")
    return sum(int(row.get("tx_bytes", 0)) for row in st["dataplane"]["planes"].values())


def _eight_ranks(bed: dict[str, Any], seed: int, layout: str) -> tuple[Config, list[Any], MrcRunner]:
    """The 2-bit config, the ranks' inputs and a runner of RANKS rank processes in `layout` (the JSON-file
    rendezvous: ranks that do not import torch start in a second, not ten)."""
    cfg = Config("eden-unbiased", 2.0, "aware", seed=seed)
    buffers = make_inputs(RANKS, SIZE // 4, "iid", seed, 0)
    runner = MrcRunner(bed["name"], RANKS, SIZE, cfg.algorithm, timeout_s=8, rendezvous="file", layout=layout)
    assert runner.layout == layout
    return cfg, buffers, runner


def test_two_ranks_per_host_agree_with_inproc_then_a_dead_rank_leaves_nothing(
        tb: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    seed = 3
    cfg, buffers, runner = _eight_ranks(tb, seed, "flat")
    try:
        assert runner.rank_hosts == [h for h in HOSTS for _ in range(2)]
        assert runner.hosts == HOSTS and runner.ranks_per_host == 2
        assert len(rank_pids(tb["name"])) == RANKS
        tx0 = {h: _tx_bytes(tb, h) for h in HOSTS}
        res, secs, down = runner.run(buffers, cfg, 0)
        tx1 = {h: _tx_bytes(tb, h) for h in HOSTS}
        assert secs > 0 and down is False
        for r in res[1:]:
            assert np.array_equal(r.out, res[0].out)
        assert all(r.messages == 2 * (RANKS - 1) for r in res)
        # half the ring's hops cross the fabric (1->2, 3->4, 5->6, 7->0), half stay on a host
        mrc_b, local_b = runner.split_bytes[0]
        assert mrc_b + local_b == sum(r.wire_bytes for r in res)
        assert mrc_b > 0 and local_b > 0
        for i, h in enumerate(HOSTS):
            # the host's odd rank sends to the next host: its bytes crossed this host's egress program
            assert tx1[h] - tx0[h] >= res[2 * i + 1].wire_bytes, h

        # the in-process ranks with the same seeds: the same result bit for bit, the same frames
        ref_file = tmp_path / "ref.npy"
        ref = subprocess.run([sys.executable, "-c", REFERENCE, str(RANKS), str(SIZE), str(seed),
                              str(ref_file)], capture_output=True, text=True, timeout=120,
                             env={**os.environ, **ONE_BLAS_THREAD})
        assert ref.returncode == 0, ref.stderr
        assert np.array_equal(res[0].out, np.load(ref_file))
        assert [r.wire_bytes for r in res] == [int(w) for w in ref.stdout.split()]

        # a rank dies (rank 3: its left neighbour is on its host, its right one on the next): the next
        # iteration fails with an error, no hang
        os.kill(runner.procs[3].pid, signal.SIGKILL)
        with pytest.raises(MrcError):
            runner.run(make_inputs(RANKS, SIZE // 4, "iid", seed, 1), cfg, 1)
    finally:
        runner.close()
    assert all(p.poll() is not None for p in runner.procs)
    assert not rank_pids(tb["name"])
    assert not runner.rundir.exists()


# the same hierarchy in process: one hub of all ranks, the groups cut from it as the rank processes do
REFERENCE_HIER = """
import sys
import numpy as np
from mrc.collective import Config, run_inproc
from mrc.collective.bench import make_inputs
from mrc.collective.hier import allreduce_hosts
n, size, seed, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
hosts = sys.argv[5].split(",")
cfg = Config("eden-unbiased", 2.0, "aware", seed=seed)
xs = make_inputs(n, size // 4, "iid", seed, 0)
res = run_inproc(n, lambda t: allreduce_hosts(t, hosts, xs[t.rank], cfg, 0))
np.save(out, res[0].out)
print(" ".join(f"{r.inter_bytes}:{r.intra_bytes}" for r in res))
"""


def test_hierarchy_over_mrc_agrees_with_inproc_and_only_leaders_cross_the_fabric(
        tb: dict[str, Any], tmp_path: Path) -> None:  # noqa: F811
    """--layout hier: each host's two ranks reduce to its first over shared memory, the four leaders run
    the ring over MRC, the result comes back. The same result and bytes as in process, bit for bit; the
    MRC bytes are the leaders' ring's; the hosts' egress programs carried them."""
    seed = 5
    cfg, buffers, runner = _eight_ranks(tb, seed, "hier")
    try:
        tx0 = {h: _tx_bytes(tb, h) for h in HOSTS}
        res, secs, down = runner.run(buffers, cfg, 0)
        tx1 = {h: _tx_bytes(tb, h) for h in HOSTS}
        assert secs > 0 and down is False
        assert all(np.array_equal(r.out, res[0].out) for r in res[1:])
        ref_file = tmp_path / "ref.npy"
        ref = subprocess.run([sys.executable, "-c", REFERENCE_HIER, str(RANKS), str(SIZE), str(seed),
                              str(ref_file), ",".join(runner.rank_hosts)], capture_output=True, text=True,
                             timeout=120, env={**os.environ, **ONE_BLAS_THREAD})
        assert ref.returncode == 0, ref.stderr
        assert np.array_equal(res[0].out, np.load(ref_file))
        split = [tuple(int(v) for v in w.split(":")) for w in ref.stdout.split()]
        assert [r.wire_bytes for r in res] == [a + b for a, b in split]
        # through MRC: exactly the leaders' ring (ranks 0, 2, 4, 6); the others only used shared memory
        mrc_b, local_b = runner.split_bytes[0]
        assert mrc_b == sum(a for a, _ in split) and local_b == sum(b for _, b in split)
        assert all(split[r][0] == 0 for r in range(1, RANKS, 2))
        assert all(split[r][0] > 0 for r in range(0, RANKS, 2))
        for i, h in enumerate(HOSTS):
            assert tx1[h] - tx0[h] >= split[2 * i][0], h
    finally:
        runner.close()
    assert not rank_pids(tb["name"])


def test_cli_eight_ranks_reports_mrc_bytes(tb: dict[str, Any]) -> None:  # noqa: F811
    r = subprocess.run([sys.executable, "-m", "mrc.ctl.cli", "-j", "allreduce", "--transport", "mrc", "-n",
                        tb["name"], "--ranks", "8", "--size", "2M", "--bits", "2", "--iters", "1",
                        "--rendezvous", "file"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, **ONE_BLAS_THREAD})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["summary"]["errors"] == 0
    c = doc["config"]
    assert c["ranks"] == 8 and c["ranks_per_host"] == 2 and c["hosts"] == HOSTS
    assert c["layout"] == "hier" and c["intra"] == "none"  # auto: the hierarchy with ranks sharing hosts
    for it in doc["iterations"]:
        assert it["wire_bytes_mrc"] + it["wire_bytes_local"] == it["wire_bytes"]
        assert it["wire_bytes_mrc"] > 0 and it["wire_bytes_local"] > 0
        assert it["vnmse"] < 1.0
    assert doc["summary"]["mean_wire_bytes_mrc"] > 0
    assert not rank_pids(tb["name"])
