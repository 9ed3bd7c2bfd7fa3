"""Ranks over MRC on default.toml (root): `mrcctl allreduce --transport mrc` runs one rank process per
host, exchanging chunks by WRITE-with-immediate through the hosts' mrcds.

Behaviour only: every rank ends with the same result, the same result as the in-process ranks with the
same seeds (the ring is deterministic given the seeds), the wire bytes as the collective accounts them, a
run through a leaf-spine link failure completes without errors, and the rank processes are gone
afterwards, also when one of them dies. The testbed and daemons come from test_daemon.py's fixture
(removed at the end, also on failure).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

pytestmark = [pytest.mark.srv6, pytest.mark.root(reason="namespaces, eBPF programs, daemons"),
              pytest.mark.netns, pytest.mark.bpf]

from rank_procs import rank_pids  # noqa: E402
from test_daemon import tb  # noqa: E402,F401  (the module-scoped testbed + mrcd fixture)

from mrc.collective import Config, allreduce, run_inproc  # noqa: E402
from mrc.collective.bench import make_inputs  # noqa: E402
from mrc.ctl.allreduce_mrc import MrcRunner  # noqa: E402
from mrc.dataplane import testbed as tbmod  # noqa: E402
from mrc.errors import MrcError  # noqa: E402

SIZE = 2 << 20
ONE_BLAS_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _mrcctl(*args: str) -> tuple[int, dict[str, Any], str]:
    r = subprocess.run([sys.executable, "-m", "mrc.ctl.cli", "-j", *args], capture_output=True, text=True,
                       timeout=300, env={**os.environ, **ONE_BLAS_THREAD})
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        doc = {}
    return r.returncode, doc, r.stderr


def test_ranks_agree_with_each_other_and_with_inproc(tb: dict[str, Any]) -> None:  # noqa: F811
    cfg = Config("eden-unbiased", 2.0, "aware", seed=3)
    buffers = make_inputs(4, SIZE // 4, "iid", 3, 0)
    with MrcRunner(tb["name"], 4, SIZE, cfg.algorithm) as runner:
        res, secs, down = runner.run(buffers, cfg, 0)
    assert secs > 0 and down is False
    for r in res[1:]:
        assert np.array_equal(r.out, res[0].out)
    ref = run_inproc(4, lambda t: allreduce(t, buffers[t.rank], cfg, 0))
    # the same frames crossed the wire: identical per-rank accounting, 2 (n - 1) messages each
    assert [r.wire_bytes for r in res] == [r.wire_bytes for r in ref]
    assert all(r.messages == 6 for r in res)
    exact = np.mean(np.stack(buffers).astype(np.float64), axis=0)

    def vn(x: np.ndarray[Any, Any]) -> float:
        return float(np.sum((x - exact) ** 2) / np.sum(exact**2))

    assert vn(res[0].out) == pytest.approx(vn(ref[0].out), rel=1e-3)
    assert not rank_pids(tb["name"])


def test_cli_is_bit_identical_to_inproc(tb: dict[str, Any]) -> None:  # noqa: F811
    common = ["allreduce", "--ranks", "4", "--size", "2M", "--bits", "2", "--partial-sums", "aware",
              "--iters", "2", "--seed", "5"]
    rc, mrc_doc, err = _mrcctl(*common, "--transport", "mrc", "-n", tb["name"])
    assert rc == 0, err
    rc, ref_doc, err = _mrcctl(*common)
    assert rc == 0, err
    assert mrc_doc["summary"]["errors"] == 0
    assert mrc_doc["config"]["transport"] == "mrc" and mrc_doc["config"]["hosts"] == ["h0", "h1", "h2", "h3"]
    for a, b in zip(mrc_doc["iterations"], ref_doc["iterations"], strict=True):
        # one BLAS thread in every process: the same float operations, the same result bit for bit
        assert a["vnmse"] == b["vnmse"]
        assert a["wire_bytes"] == b["wire_bytes"]
        assert a["failed_link_down"] is False
    assert not rank_pids(tb["name"])


def test_link_failure_mid_run(tb: dict[str, Any]) -> None:  # noqa: F811
    rc, doc, err = _mrcctl("allreduce", "--transport", "mrc", "-n", tb["name"], "--ranks", "4",
                           "--size", "2M", "--bits", "2", "--iters", "40", "--fail-link", "p0l0:p0s0@0.3",
                           "--heal-after", "0.4", "--sample-ms", "100")
    assert rc == 0, err
    assert doc["summary"]["errors"] == 0
    assert all(r["time_s"] is not None and r["vnmse"] < 1.0 for r in doc["iterations"])
    assert any(r["failed_link_down"] for r in doc["iterations"])
    assert not doc["iterations"][0]["failed_link_down"]
    f = doc["failure"]
    assert f["link"] == "p0l0-p0s0" and len(f["down_s"]) == 1 and f["up_s"][0] > f["down_s"][0]
    tl = doc["timeline"]
    assert len(tl["plane_tx_gbps"]) == 4 and len(tl["t_s"]) == len(tl["plane_tx_gbps"][0]) > 0
    t = tbmod.Testbed.load(tb["name"])
    assert t.link_state(t.link("p0l0", "p0s0")).up
    assert not rank_pids(tb["name"])


def test_file_rendezvous_then_a_dead_rank_fails_the_run_and_leaves_nothing(tb: dict[str, Any]) -> None:  # noqa: F811
    cfg = Config("eden-unbiased", 2.0, "aware")
    # the JSON-file rendezvous (the one used where torch is not importable)
    runner = MrcRunner(tb["name"], 4, SIZE, cfg.algorithm, timeout_s=10, rendezvous="file")
    try:
        assert runner.rendezvous == "json files"
        res, _secs, _down = runner.run(make_inputs(4, SIZE // 4, "iid", 0, 0), cfg, 0)
        assert all(np.array_equal(r.out, res[0].out) for r in res)
        os.kill(runner.procs[2].pid, signal.SIGKILL)
        with pytest.raises(MrcError):
            runner.run(make_inputs(4, SIZE // 4, "iid", 0, 1), cfg, 1)
    finally:
        runner.close()
    assert all(p.poll() is not None for p in runner.procs)
    assert not rank_pids(tb["name"])
    assert not runner.rundir.exists()


@pytest.mark.parametrize("zero_copy", ["1", "0"])
def test_uncompressed_ranks_reuse_their_memory(tb: dict[str, Any], zero_copy: str,  # noqa: F811
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # 8 MiB per rank: 2,048 pages. With the copies (MRC_RING_ZERO_COPY=0) the ranks fault in ~1.2x their
    # buffers' pages of fresh memory per iteration (measured 10,100-10,300 for 8,192; the kernel zeroes
    # every one: docs/collective.md, "Rank memory"); with views, a kept result buffer and RANK_MALLOC,
    # almost none after the first iteration (measured 1-5)
    monkeypatch.setenv("MRC_RING_ZERO_COPY", zero_copy)
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    rc, doc, err = _mrcctl("allreduce", "--transport", "mrc", "-n", tb["name"], "--ranks", "4",
                           "--size", "8M", "--scheme", "none", "--iters", "3")
    assert rc == 0, err
    assert doc["summary"]["errors"] == 0
    pages = 4 * (8 << 20) // 4096  # the four ranks' buffers
    later = doc["iterations"][1:]
    assert all(r["rank_cpu_s"] > 0 for r in doc["iterations"])
    faults = max(r["rank_page_faults"] for r in later)
    if zero_copy == "1":
        assert faults < pages // 2, doc["iterations"]
    else:  # the measurement itself: the copies do fault, so the bound above means something
        assert faults > pages // 2, doc["iterations"]
    assert not rank_pids(tb["name"])
