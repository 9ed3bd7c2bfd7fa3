"""`mrcctl allreduce` (in-process transport): table, JSON keys of the issue, errors; the JSON-file
rendezvous of the MRC ranks; host-major rank placement and the intra-host carrier of co-located ranks
(shared memory + a Unix socket per pair, no mrcd needed when every rank is on one host)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mrc.collective import Config, TransportError, allreduce, run_inproc
from mrc.collective.bench import make_inputs
from mrc.ctl.allreduce_mrc import place_ranks
from mrc.ctl.cli import main
from mrc.ctl.cmd_allreduce import add_per_iteration, parse_size, render
from mrc.dataplane.collective import FileStore, RankTransport, open_store
from mrc.errors import MrcError, UsageError


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "-j", "allreduce", "--ranks", "3", "--size", "40000", "--iters", "2",
                      "--bits", "2", "--partial-sums", "naive")
    assert rc == 0
    doc = json.loads(out)
    assert set(doc) == {"config", "iterations", "summary"}
    assert doc["config"]["ranks"] == 3 and doc["config"]["transport"] == "inproc"
    assert [r["iter"] for r in doc["iterations"]] == [0, 1]
    for r in doc["iterations"]:
        keys = {"iter", "time_s", "algbw_gbps", "busbw_gbps", "wire_bytes", "vnmse", "failed_link_down"}
        assert keys <= set(r)
        assert r["failed_link_down"] is False
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * 2 / 3)
        assert 0 < r["vnmse"] < 2
    assert {"median_time_s", "median_busbw_gbps", "mean_vnmse", "errors"} <= set(doc["summary"])
    assert doc["summary"]["errors"] == 0


def test_table_and_none_is_exact(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run(capsys, "allreduce", "--ranks", "4", "--size", "4K", "--iters", "1",
                        "--scheme", "none")
    assert rc == 0
    assert "BUSBW_GB/s" in out and "median" in out
    assert "iter 0" in err  # progress on stderr
    rc, out, _ = _run(capsys, "-j", "allreduce", "--ranks", "4", "--size", "4K", "--iters", "1",
                      "--scheme", "none")
    doc = json.loads(out)
    assert doc["iterations"][0]["vnmse"] < 1e-12
    assert doc["iterations"][0]["wire_bytes"] == 2 * 3 * 4096  # 2 (n-1)/n of the buffer, per rank


def test_errors(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "-j", "allreduce", "--scheme", "drive", "--bits", "2")
    assert rc != 0 and "drive" in json.loads(out)["error"]
    rc, _, err = _run(capsys, "allreduce", "--size", "7")
    assert rc != 0 and "float32" in err
    rc, out, _ = _run(capsys, "-j", "allreduce", "--transport", "mrc", "-n", "no-such-testbed-x")
    assert rc != 0 and "no-such-testbed-x" in json.loads(out)["error"]
    # failure injection, sampling and rendezvous belong to ranks over MRC
    for extra in (["--fail-link", "p0l0:p0s0@1"], ["--sample-ms", "100"], ["--rendezvous", "file"],
                  ["--ranks-per-host", "2"]):
        rc, out, _ = _run(capsys, "-j", "allreduce", *extra)
        assert rc != 0 and "--transport mrc" in json.loads(out)["error"]


def test_hierarchical_allreduce_from_the_cli(capsys: pytest.CaptureFixture[str]) -> None:
    """`--hosts H`: 8 ranks as 2 hosts x 4 run the hierarchical all-reduce. Only the leaders' 2-rank ring
    crosses hosts, so the result's error is that of a 2-rank ring (far below the flat 8-rank ring's on
    the same inputs) and the bytes between hosts are a fraction of the flat ring's; what stays within the
    hosts is counted apart."""
    args = ["-j", "allreduce", "--ranks", "8", "--size", "256K", "--iters", "2", "--dist", "correlated"]
    rc, out, _ = _run(capsys, *args)
    assert rc == 0
    flat = json.loads(out)
    rc, out, _ = _run(capsys, *args, "--hosts", "2")
    assert rc == 0
    hier = json.loads(out)
    assert hier["config"]["transport"] == "inproc-hier" and hier["config"]["hier_hosts"] == 2
    assert len(hier["config"]["bits_per_hop"]) == 2  # the ring runs over the 2 leaders
    assert hier["summary"]["mean_vnmse"] < 0.6 * flat["summary"]["mean_vnmse"]
    assert hier["summary"]["mean_wire_bytes"] < 0.25 * flat["summary"]["mean_wire_bytes"]
    for r in hier["iterations"]:
        assert r["intra_host_bytes"] > 0
    rc, out, _ = _run(capsys, "-j", "allreduce", "--ranks", "8", "--hosts", "3")
    assert rc != 0 and "multiple" in json.loads(out)["error"]
    rc, out, _ = _run(capsys, "-j", "allreduce", "--transport", "mrc", "--hosts", "2", "-n", "x")
    assert rc != 0 and "--transport inproc" in json.loads(out)["error"]


def test_report_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    rc, out, _ = _run(capsys, "allreduce", "--ranks", "2", "--size", "4K", "--iters", "1",
                      "--report", str(path))
    assert rc == 0 and "median" in out
    assert json.loads(path.read_text())["config"]["ranks"] == 2


def test_file_rendezvous(tmp_path: Path) -> None:
    a, b = FileStore(tmp_path / "s", timeout_s=0.2), FileStore(tmp_path / "s", timeout_s=0.2)
    a.set("job/rank0", '{"qpn": 7}')
    assert json.loads(b.get("job/rank0")) == {"qpn": 7}
    a.set("job/rank0", "again")  # replaced atomically, never half-written
    assert b.get("job/rank0") == "again"
    assert not [p for p in (tmp_path / "s").iterdir() if p.name.endswith(".tmp")]
    with pytest.raises(MrcError, match="job/rank1"):
        b.get("job/rank1")
    assert isinstance(open_store(f"file:{tmp_path / 's'}"), FileStore)
    with pytest.raises(MrcError):
        open_store("nfs://x")


def test_parse_size() -> None:
    assert parse_size("64M") == 64 << 20
    assert parse_size("4KiB") == 4096
    assert parse_size("1048576") == 1 << 20
    with pytest.raises(UsageError):
        parse_size("lots")


def test_place_ranks_host_major() -> None:
    hosts = ["h0", "h1", "h2", "h3"]
    assert place_ranks(hosts, 4) == hosts
    assert place_ranks(hosts, 3) == ["h0", "h1", "h2"]
    assert place_ranks(hosts, 8) == ["h0", "h0", "h1", "h1", "h2", "h2", "h3", "h3"]
    assert place_ranks(hosts, 8, 4) == ["h0"] * 4 + ["h1"] * 4
    assert place_ranks(hosts, 6, 2) == ["h0", "h0", "h1", "h1", "h2", "h2"]
    for ranks, k, why in ((6, None, "multiple"), (1, None, "at least 2"), (8, 8, "one host"),
                          (12, 2, "6 hosts"), (8, 3, "whole number")):
        with pytest.raises(MrcError, match=why):
            place_ranks(hosts, ranks, k)


def _co_located(tmp_path: Path, n: int, fn: Callable[[RankTransport], Any], slot_bytes: int = 1 << 16,
                timeout_s: float = 20.0) -> list[Any]:
    """fn(transport) for n ranks of one host, each a thread with its own RankTransport (intra-host carrier
    only: no mrcd involved), rendezvous in JSON files."""
    out: list[Any] = [None] * n
    errs: list[BaseException] = []

    def body(r: int) -> None:
        try:
            t = RankTransport(FileStore(tmp_path / "rv", timeout_s), r, ["h0"] * n, "unused", slot_bytes,
                              timeout_s=timeout_s, prefix=f"u{tmp_path.name}")
        except BaseException as e:
            errs.append(e)
            return
        try:
            out[r] = fn(t)
        except BaseException as e:
            errs.append(e)
        finally:
            t.close()

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    if errs:
        raise errs[0]
    return out


def test_intra_host_ring_bit_identical_to_inproc(tmp_path: Path) -> None:
    cfg = Config("eden-unbiased", 2.0, "aware", seed=4)
    xs = make_inputs(3, 70_001, "iid", 4, 0)  # chunks of several segments: pipelined over 2 slots
    got = _co_located(tmp_path, 3, lambda t: (allreduce(t, xs[t.rank], cfg, 0), t.mrc_bytes, t.local_bytes,
                                              t.send_window), slot_bytes=1 << 18)
    ref = run_inproc(3, lambda t: allreduce(t, xs[t.rank], cfg, 0))
    for (res, mrc_b, local_b, window), r in zip(got, ref, strict=True):
        assert np.array_equal(res.out, ref[0].out) and np.array_equal(r.out, ref[0].out)
        assert res.wire_bytes == r.wire_bytes == local_b and mrc_b == 0 and window == 2


def test_intra_host_tag_check_deadline_and_gone_peer(tmp_path: Path) -> None:
    sent = threading.Event()

    def fn(t: RankTransport) -> str:
        if t.rank == 0:
            t.send(1, 7, b"x" * 100)
            t.send(1, 8, b"y")
            with pytest.raises(TransportError, match="exceeds the slot"):
                t.send(1, 9, b"z" * (1 << 17))
            with pytest.raises(TransportError, match="no credit"):  # 2 slots, nobody consumed them
                t.send(1, 9, b"z")
            sent.set()
            return "sent"
        assert sent.wait(10)
        assert t.recv(0, 7) == b"x" * 100
        with pytest.raises(TransportError, match="expected tag 9"):
            t.recv(0, 9)
        with pytest.raises(TransportError, match=r"closed|lost"):  # rank 0 left: end of stream
            t.recv(0, 9)
        return "checked"

    assert _co_located(tmp_path, 2, fn, timeout_s=1.0) == ["sent", "checked"]


def test_split_bytes_in_the_report() -> None:
    doc: dict[str, Any] = {
        "config": {"ranks": 8, "size_bytes": 64, "scheme": "none", "algorithm": "ring", "transport": "mrc",
                   "dist": "iid", "ranks_per_host": 2, "hosts": ["h0", "h1"]},
        "iterations": [{"iter": 0, "time_s": 0.1, "algbw_gbps": 1.0, "busbw_gbps": 1.0, "wire_bytes": 30,
                        "vnmse": 0.0, "failed_link_down": False},
                       {"iter": 1, "time_s": None, "algbw_gbps": None, "busbw_gbps": None,
                        "wire_bytes": None, "vnmse": None, "failed_link_down": False, "error": "x"}],
        "summary": {"median_time_s": 0.1, "median_busbw_gbps": 1.0, "mean_vnmse": 0.0,
                    "mean_wire_bytes": 30.0, "errors": 1},
    }
    add_per_iteration(doc, {0: (10, 20), 1: (5, 5)}, ("wire_bytes_mrc", "wire_bytes_local"))
    add_per_iteration(doc, {0: (0.25, 7)}, ("rank_cpu_s", "rank_page_faults"))
    assert doc["iterations"][0]["rank_cpu_s"] == 0.25 and doc["summary"]["mean_rank_page_faults"] == 7
    assert doc["iterations"][0]["wire_bytes_mrc"] == 10 and doc["iterations"][0]["wire_bytes_local"] == 20
    assert "wire_bytes_mrc" not in doc["iterations"][1]
    assert doc["summary"]["mean_wire_bytes_mrc"] == 10
    text = render(doc)
    assert "MRC_B" in text and "ranks per host: 2" in text


def test_intra_drive_runs_and_intra_without_a_hierarchy_is_refused(
        capsys: pytest.CaptureFixture[str]) -> None:
    """`--intra drive` always failed ("drive is the 1-bit scheme, got bits=8.0": the intra-host codec was
    built at 8 bits, an option the CLI does not have); in process without --hosts, --intra was ignored."""
    from mrc.ctl.cli import main

    rc = main(["-j", "allreduce", "--ranks", "4", "--hosts", "2", "--intra", "drive", "--size", "64K",
               "--iters", "1"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["summary"]["errors"] == 0, doc
    rc = main(["-j", "allreduce", "--ranks", "4", "--intra", "drive", "--size", "64K", "--iters", "1"])
    assert rc == 2 and "--hosts H" in json.loads(capsys.readouterr().out)["error"]
