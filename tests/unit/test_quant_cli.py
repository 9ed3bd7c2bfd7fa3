"""`mrcctl quant`: JSON document shape, table output, progress only in text mode, clear errors."""

from __future__ import annotations

import json

import pytest

from mrc.ctl.cli import main

ROW_KEYS = {
    "scheme", "bits", "dim", "dist", "rotations", "vnmse", "vnmse_stderr", "wire_bytes", "bits_per_coord",
    "encode_mbps", "decode_mbps",
}


def test_bench_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["quant", "bench", "--dim", "256", "--trials", "3", "--bits", "1,2.5,3", "-j"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert err == ""  # no progress in JSON mode
    doc = json.loads(out)
    assert doc["config"]["dim"] == 256 and doc["config"]["bits"] == [1, 2.5, 3]
    rows = doc["rows"]
    got = {(r["scheme"], r["bits"]) for r in rows}
    # drive only at b = 1, TurboQuant only at integer b
    assert got == {
        ("eden-unbiased", 1), ("eden-unbiased", 2.5), ("eden-unbiased", 3),
        ("eden-biased", 1), ("eden-biased", 2.5), ("eden-biased", 3), ("drive", 1),
        ("turboquant-mse", 1), ("turboquant-mse", 3), ("turboquant-prod", 1), ("turboquant-prod", 3),
    }
    for r in rows:
        assert set(r) >= ROW_KEYS
        assert r["dim"] == 256 and r["dist"] == "gauss" and r["rotations"] == "auto"
        assert 0 < r["vnmse"] < 3 and r["vnmse_stderr"] >= 0
        assert r["bits_per_coord"] == pytest.approx(8 * r["wire_bytes"] / 256)
        assert r["bits_per_coord"] >= r["bits"]
        assert r["encode_mbps"] > 0 and r["decode_mbps"] > 0


def test_bench_text_progress_and_clients(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main([
        "quant", "bench", "--schemes", "eden-unbiased,eden-biased", "--bits", "2", "--dim", "128",
        "--trials", "2", "--clients", "4", "--dist", "lognormal", "--rotations", "2",
    ])
    out, err = capsys.readouterr()
    assert rc == 0
    assert "quant bench: eden-unbiased b=2" in err
    lines = out.splitlines()
    assert "clients=4" in lines[0]
    assert "MEAN_NMSE" in lines[1] and "vNMSE" in lines[1]
    assert lines[2].startswith("eden-unbiased") and lines[3].startswith("eden-biased")


def test_bench_clients_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["-j", "quant", "bench", "--schemes", "drive", "--bits", "1", "--dim", "64", "--trials", "2",
               "--clients", "3"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    (row,) = doc["rows"]
    assert row["clients"] == 3 and row["mean_nmse"] > 0 and row["mean_theory"] is not None


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--schemes", "nope"], "unknown scheme"),
        (["--bits", "9"], "outside"),
        (["--bits", "x"], "not a number"),
        (["--rotations", "4"], "rotations"),
        (["--dist", "cauchy"], "cauchy"),
        (["--schemes", "drive", "--bits", "2"], "no (scheme, bits)"),
    ],
)
def test_bench_errors(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    rc = main(["quant", "bench", "--dim", "16", "--trials", "1", *args, "-j"])
    out, err = capsys.readouterr()
    assert rc != 0
    assert needle in json.loads(out)["error"]
    assert "Traceback" not in err


def test_codebook(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quant", "codebook", "--bits", "1", "-j"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["centroids"] == pytest.approx([-0.7978845608, 0.7978845608])
    assert main(["quant", "codebook", "--bits", "3"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("bits=3 D_b=0.0345478") and len(out.splitlines()) == 2 + 8


def test_show_is_the_default_verb(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quant"]) == 0
    out = capsys.readouterr().out
    assert "eden-unbiased" in out and "turboquant-prod" in out
    assert main(["quant", "show", "-j"]) == 0
    doc = json.loads(capsys.readouterr().out)
    drive = next(r for r in doc["schemes"] if r["scheme"] == "drive")
    assert drive["theory_b1"] == pytest.approx(0.5707963) and drive["theory_b2"] is None


def test_bench_mean_estimation_holds_one_client_at_a_time() -> None:
    """`--clients N` kept every client's vector (plus a float64 stack of them): clients x dim x 12
    bytes, a MemoryError traceback at the option's limits. Now one vector and two float64 sums; the
    mean estimate still matches the theory (unbiased: the per-client vNMSE / N)."""
    import tracemalloc

    from mrc.quant import bench as qbench

    dim, clients = 4096, 400
    qbench.run(["eden-unbiased"], [2.0], dim, 1, clients=2)  # warm-up: caches, numba
    tracemalloc.start()
    try:
        (row,) = qbench.run(["eden-unbiased"], [2.0], dim, 1, clients=clients, seed=5)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * dim * 8, peak  # was > clients x dim x 12 = 19.7 MB
    assert 0.5 < row["mean_nmse"] / row["mean_theory"] < 1.5


def test_out_of_memory_is_one_json_error() -> None:
    """Sizes the options allow (--dim up to 2^28) beyond what the machine holds ended in numpy's
    _ArrayMemoryError traceback, and under -j with no document at all. Here the address space is capped
    at 3 GB to make the allocation fail."""
    import resource
    import subprocess
    import sys

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (3 * 10**9, 3 * 10**9))

    r = subprocess.run([sys.executable, "-m", "mrc.ctl.cli", "-j", "quant", "bench", "--dim", "268435456",
                        "--trials", "1", "--bits", "1", "--schemes", "drive"], capture_output=True, text=True,
                       timeout=300, preexec_fn=cap)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert json.loads(r.stdout)["error"].startswith("out of memory"), r.stdout
