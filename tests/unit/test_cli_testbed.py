"""`mrcctl testbed` without a kernel: bad topology files and missing testbeds are one-line errors with a
non-zero exit, before anything is built (the root tests in tests/netns cover the real thing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mrc.ctl.cli import main

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def private_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MRC_RUN_DIR", str(tmp_path / "run"))


def test_bad_topology_file_names_file_key_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text((ROOT / "deploy/topologies/small.toml").read_text().replace("leaf = 1", "leaf = 7"))
    rc = main(["-j", "testbed", "up", str(bad), "--name", "x1"])
    out, _ = capsys.readouterr()
    assert rc == 2
    lines = bad.read_text().splitlines()
    second = lines.index("[[hosts]]", 1 + lines.index("[[hosts]]"))
    line = lines.index("leaf = 7", second) + 1  # the key's own line in that [[hosts]] entry
    assert json.loads(out)["error"] == f"{bad}:{line}: hosts[1].leaf: leaf 7 does not exist (leaves are 0..1)"


def test_delay_refused_before_building(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "d.toml"
    text = (ROOT / "deploy/topologies/small.toml").read_text()
    f.write_text(text.replace("mtu = 9000", 'mtu = 9000\ndelay = "2ms"'))
    rc = main(["testbed", "up", str(f), "--name", "x2"])
    _, err = capsys.readouterr()
    assert rc == 1 and "netem" in err and "Traceback" not in err


def test_no_testbed_up(capsys: pytest.CaptureFixture[str]) -> None:
    cases = (["testbed", "show"], ["testbed", "ping"], ["testbed", "down"], ["testbed", "exec", "h0", "true"])
    for args in cases:
        rc = main(["-j", *args])
        out, _ = capsys.readouterr()
        assert rc == 1, args
        assert "no testbed is up" in json.loads(out)["error"]


def test_list_empty_and_bad_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-j", "testbed", "list"]) == 0
    assert json.loads(capsys.readouterr().out) == {"testbeds": []}
    rc = main(["testbed", "up", str(ROOT / "deploy/topologies/small.toml"), "--name", "Bad-Name"])
    assert rc == 1 and "testbed name 'Bad-Name'" in capsys.readouterr().err
    rc = main(["testbed", "link", "set", "h0", "p0l0", "--rate", "fast"])
    assert rc == 2 and "not a rate" in capsys.readouterr().err
