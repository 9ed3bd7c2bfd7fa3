"""Error lines of mrcctl and mrcd that were tracebacks, argparse's usage block or a bare "Input/output
error", each pinned by a test that failed before its fix: pyroute2 missing, mrcd's usage errors, and a
unix socket path longer than sun_path holds ($MRC_SOCKET, mrcd --socket, the client, the listener)."""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mrc.ctl.cli import main
from mrc.dataplane.client import MrcClient
from mrc.errors import MrcError
from mrc.hostconfig import MAX_SOCKET_PATH

ROOT = Path(__file__).resolve().parents[2]
Cap = pytest.CaptureFixture[str]
HINT = "pyroute2 is not importable: run `make setup` (or pip install pyroute2)"
NOWHERE = Path("/nonexistent")  # a short base whatever pytest's tmp_path is: these paths are never made


def _long_path(base: Path, nbytes: int) -> Path:
    """A socket path under `base` of exactly `nbytes` bytes (nothing is created)."""
    head = f"{base}/"
    assert len(head) < nbytes, f"{base} is too long for this test"
    return Path(head + "s" * (nbytes - len(head)))


# ------------------------------------------------------------------------------ pyroute2 not importable


def _without_pyroute2(*args: str) -> subprocess.CompletedProcess[str]:
    """mrcctl `args` in a fresh interpreter where pyroute2 cannot be imported (as without `make setup`)."""
    code = ("import sys\nsys.modules['pyroute2'] = None\nfrom mrc.ctl.cli import main\n"
            f"sys.exit(main({list(args)!r}))")
    env = {k: v for k, v in os.environ.items() if k != "MRC_SOCKET"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=120)


@pytest.mark.parametrize("obj", ["qp", "stats"])
def test_without_pyroute2_mrcctl_says_what_to_install(obj: str) -> None:
    """Was an ImportError traceback (ctl/api.py -> dataplane/testbed.py -> netns.py imports pyroute2)."""
    r = _without_pyroute2(obj)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"mrcctl: error: {HINT}\n")
    r = _without_pyroute2("-j", obj, "show")
    assert (r.returncode, r.stderr) == (1, "") and json.loads(r.stdout) == {"error": HINT}


def test_without_pyroute2_mrcd_says_what_to_install() -> None:
    """The `mrcd` command (pyproject's script, `mrcd_entry.main`) was an import traceback: the daemon's
    data-plane modules import pyroute2 when loaded."""
    code = ("import sys\nsys.modules['pyroute2'] = None\nfrom mrc.ctl.mrcd_entry import main\n"
            "sys.exit(main(['--help']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert (r.returncode, r.stdout, r.stderr) == (1, "", f"mrcd: error: {HINT}\n")
    ok = subprocess.run([sys.executable, "-c", code.replace("sys.modules['pyroute2'] = None\n", "")],
                        capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert ok.returncode == 0 and "--config" in ok.stdout


def test_other_missing_modules_are_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a dependency the hint names is turned into a line; any other missing module is a bug."""
    from mrc.ctl import cli

    def boom(*_a: Any, **_k: Any) -> None:
        raise ModuleNotFoundError("No module named 'mrc.ctl.nothing'", name="mrc.ctl.nothing")

    monkeypatch.setattr(cli.cli, "main", boom)
    with pytest.raises(ModuleNotFoundError):
        main(["qp"])


# ----------------------------------------------------------------------------------- mrcd usage errors


def _mrcd(capsys: Cap, *args: str) -> tuple[int | str | None, str, str]:
    from mrc.ctl.daemon import main as mrcd_main

    with pytest.raises(SystemExit) as e:
        mrcd_main(list(args))
    out, err = capsys.readouterr()
    return e.value.code, out, err


@pytest.mark.parametrize(("args", "error"), [
    (["--config", "x.toml", "--bogus"], "unrecognized arguments: --bogus"),
    (["--bogus"], "one of the arguments --config --check-config --host is required"),
    (["--host", "h0", "--evs", "many"], "argument --evs: invalid int value: 'many'"),
    (["--host", "h0", "--reorder-us", "x"], "argument --reorder-us: 'x': expected a whole number of "
                                            "microseconds"),
])
def test_mrcd_usage_errors_are_one_line(capsys: Cap, args: list[str], error: str) -> None:
    """Were argparse's usage block (four lines) and then the error; exit status 2 as before."""
    assert _mrcd(capsys, *args) == (2, "", f"mrcd: error: {error}; see 'mrcd --help'\n")


def test_mrcd_help_is_still_whole(capsys: Cap) -> None:
    code, out, err = _mrcd(capsys, "--help")
    assert code == 0 and err == ""
    assert out.startswith("usage: mrcd ") and "--socket" in out and "--no-netns" in out


# ----------------------------------------------------------------------------- socket paths too long


def test_an_over_long_mrc_socket_names_the_variable_and_the_limit(
    capsys: Cap, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was `mrcctl: error: <path>: Input/output error` (connect's OSError carries no errno)."""
    sock = _long_path(NOWHERE, 300)
    monkeypatch.setenv("MRC_SOCKET", str(sock))
    for obj in ("qp", "stats"):
        assert main([obj]) == 1
        out, err = capsys.readouterr()
        assert out == ""
        assert err == (f"mrcctl: error: MRC_SOCKET path is 300 bytes; a unix socket path holds at most "
                       f"{MAX_SOCKET_PATH}: {sock}\n")


def test_the_client_refuses_a_path_past_the_limit_and_not_one_at_it() -> None:
    with pytest.raises(MrcError) as e:
        MrcClient(_long_path(NOWHERE, MAX_SOCKET_PATH + 1), timeout=1.0)
    assert str(e.value).endswith(f": {MAX_SOCKET_PATH + 1} bytes; a unix socket path holds at most "
                                 f"{MAX_SOCKET_PATH}")
    with pytest.raises(MrcError, match="no mrcd is listening"):  # at the limit: connect runs, finds nothing
        MrcClient(_long_path(NOWHERE, MAX_SOCKET_PATH), timeout=1.0)


def test_mrcd_refuses_an_over_long_socket_option(capsys: Cap) -> None:
    sock = _long_path(NOWHERE, 200)
    code, out, err = _mrcd(capsys, "--host", "h0", "--socket", str(sock))
    assert (code, out) == (2, "")
    assert err == (f"mrcd: error: argument --socket: {sock}: 200 bytes; a unix socket path holds at most "
                   f"{MAX_SOCKET_PATH}; see 'mrcd --help'\n")


def test_the_control_server_refuses_an_over_long_path(tmp_path: Path) -> None:
    """mrcd's own listener (a testbed's socket under a long $MRC_RUN_DIR): an MrcError, which mrcd prints
    as its one error line, instead of bind's errno-less OSError."""
    from mrc.ctl.control_server import ControlServer

    sock = _long_path(tmp_path / "run", 150)
    server = ControlServer(selectors.DefaultSelector(), handler=None)  # type: ignore[arg-type]
    with pytest.raises(MrcError, match=f": 150 bytes; a unix socket path holds at most {MAX_SOCKET_PATH}$"):
        server.listen(sock)
    assert not sock.parent.exists()  # refused before anything was made
