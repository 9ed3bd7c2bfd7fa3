"""`mrcctl prog|port|fault` without a kernel: empty state, usage errors and missing testbeds or programs are
one-line errors (or {"error": ...}) with a non-zero exit (tests/bpf covers the real thing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mrc.ctl.cli import main


@pytest.fixture(autouse=True)
def private_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MRC_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setenv("MRC_BPF_PIN_ROOT", str(tmp_path / "pins"))


def test_prog_show_empty(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-j", "prog"]) == 0
    assert json.loads(capsys.readouterr().out) == {"programs": []}
    assert main(["prog", "show"]) == 0
    assert "no mrc eBPF programs" in capsys.readouterr().out


def test_prog_detach_needs_one_scope(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --all or --name: the only testbed up, as every command's --name help says (it was a usage
    error, against that help); both at once is a usage error."""
    assert main(["prog", "detach"]) == 1
    assert "no testbed is up" in capsys.readouterr().err
    assert main(["prog", "detach", "--all", "--name", "x"]) == 2
    assert "--all or --name TESTBED, not both" in capsys.readouterr().err
    assert main(["-j", "prog", "detach", "--all"]) == 0
    assert json.loads(capsys.readouterr().out) == {"records_removed": 0, "attachments_removed": 0,
                                                   "pins_removed": 0}


def test_no_testbed(capsys: pytest.CaptureFixture[str]) -> None:
    for args in (["port", "stats"], ["port", "set", "p0l1", "h1", "--buffer", "64KiB"], ["fault"],
                 ["fault", "set", "a", "b", "--blackhole"], ["fault", "clear"]):
        assert main(["-j", *args]) == 1, args
        assert "no testbed is up" in json.loads(capsys.readouterr().out)["error"]


def test_no_programs_on_testbed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from mrc import topology
    from mrc.dataplane.testbed import Testbed

    topo = topology.load(Path(__file__).resolve().parents[2] / "deploy/topologies/small.toml")
    Testbed(name="t1", topo=topo, source="small.toml").save()  # a recorded testbed, nothing attached
    assert main(["-j", "port", "stats", "--name", "t1"]) == 1
    assert "no eBPF programs attached" in json.loads(capsys.readouterr().out)["error"]


def test_usage_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fault", "set", "a", "b"]) == 2
    assert "exactly one of --drop P or --blackhole" in capsys.readouterr().err
    assert main(["fault", "set", "a", "b", "--drop", "1.5"]) == 2
    capsys.readouterr()
    assert main(["fault", "clear", "a"]) == 2
    assert "both ends" in capsys.readouterr().err
    assert main(["fault", "set", "--blackhole"]) == 2
    assert "name a link (A B) or a plane" in capsys.readouterr().err
    assert main(["fault", "set", "a", "b", "--plane", "1", "--blackhole"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["port", "set", "p0l1", "h1"]) == 2
    assert "nothing to set" in capsys.readouterr().err
    assert main(["port", "set", "p0l1", "h1", "--buffer", "lots"]) == 2
    assert "not a size" in capsys.readouterr().err
