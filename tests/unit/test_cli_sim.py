"""`mrcctl sim loopback`: the report's keys, JSON and text output, and input errors."""

from __future__ import annotations

import json

import pytest

from mrc.ctl.cli import main

KEYS = {
    "completed", "bit_exact", "sim_time_s", "wall_s", "data_packets", "retransmits", "trims", "ev_states",
    "engine_pps", "events",
}


def test_loopback_json_report(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["sim", "loopback", "--size", "1M", "--loss", "0.02", "--trim", "0.01", "--jitter", "1us",
               "--blackhole-plane", "1@20us-100us", "--seed", "3", "-j"])
    out, err = capsys.readouterr()
    assert rc == 0 and err == ""
    doc = json.loads(out)
    assert set(doc) >= KEYS
    assert doc["completed"] is True and doc["bit_exact"] is True
    assert doc["data_packets"] >= 256 and doc["engine_pps"] > 0
    assert set(doc["retransmits"]) == {"sack", "trim", "timeout", "nack", "spurious"}
    assert set(doc["ev_states"]) == {"plane0", "plane1", "plane2", "plane3"}
    assert sum(doc["ev_states"]["plane1"].values()) == 32


def test_loopback_text_report(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["sim", "loopback", "--size", "256K", "--ecn-plane", "2", "--planes", "3", "--evs", "48"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert "bit-exact yes" in out and "plane2" in out and "loopback:" in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--size", "12Q"], "not a size"),
        (["--blackhole-plane", "9@1us"], "does not exist"),
        (["--blackhole-plane", "1@2ms-1ms"], "heals before"),
        (["--blackhole-plane", "0@20s"], "its times must be 0..10s"),
        (["--loss", "1.5"], "'--loss': must be in [0, 1), got 1.5"),
        (["--evs", "2"], "evs must be"),
        (["--ecn-plane", "7"], "does not exist"),
        (["--jitter", "fast"], "bad time"),
    ],
)
def test_loopback_bad_input(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    rc = main(["sim", "loopback", *args, "-j"])
    out, _ = capsys.readouterr()
    assert rc != 0 and needle in json.loads(out)["error"]


def test_a_failed_loopback_transfer_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    """Every plane blackholed for good: the QP ends in RETRY_EXC_ERR. The document says so, and the exit
    status now too (it was 0, so a script could not tell a failed transfer from a good one)."""
    rc = main(["sim", "loopback", "--size", "64K", "--planes", "1", "--evs", "4", "--blackhole-plane", "0@0",
               "-j"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and not doc["completed"] and doc["status"] == ["RETRY_EXC_ERR"]
    assert main(["sim", "loopback", "--size", "64K", "-j"]) == 0
