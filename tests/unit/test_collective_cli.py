"""`mrcctl allreduce` (in-process transport): table, JSON keys of the issue, errors; the JSON-file
rendezvous of the MRC ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mrc.ctl.cli import main
from mrc.ctl.cmd_allreduce import parse_size
from mrc.dataplane.collective import FileStore, open_store
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
    for extra in (["--fail-link", "p0l0:p0s0@1"], ["--sample-ms", "100"], ["--rendezvous", "file"]):
        rc, out, _ = _run(capsys, "-j", "allreduce", *extra)
        assert rc != 0 and "--transport mrc" in json.loads(out)["error"]


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
