"""A testbed's state file is read back by every later command: damaged or foreign state is an MrcError
naming the file, and a name is a name, never a path."""

from __future__ import annotations

from pathlib import Path

import pytest

from mrc.dataplane import testbed as tbmod
from mrc.errors import MrcError


def test_damaged_state_nested_too_deeply_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was a RecursionError traceback (only OSError and ValueError were caught)."""
    monkeypatch.setenv("MRC_RUN_DIR", str(tmp_path))
    d = tbmod.run_dir()
    d.mkdir(parents=True, exist_ok=True)
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(MrcError, match=r"deep\.json: unreadable testbed state: nested too deeply"):
        tbmod.Testbed.load("deep")


def test_a_testbed_name_is_not_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`-n ../../x` read any *.json (and its error suggested `testbed down --name ../../x`)."""
    monkeypatch.setenv("MRC_RUN_DIR", str(tmp_path / "run"))
    (tmp_path / "x.json").write_text("{}")
    for name in ("../../x", "../x", "X", "a/b", ""):
        with pytest.raises(MrcError, match="use a lowercase letter"):
            tbmod.Testbed.load(name)
