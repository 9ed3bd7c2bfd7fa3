"""mrcctl's contract (docs/design.md §7): one JSON document per call with -j, errors as {"error": ...} or one
line, non-zero exit either way, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mrc.ctl.cli import main


def test_unknown_object_json_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["-j", "no-such-object"])
    out, err = capsys.readouterr()
    assert rc != 0
    doc = json.loads(out)
    assert set(doc) == {"error"} and "no-such-object" in doc["error"]
    assert "Traceback" not in err


def test_unknown_object_plain_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["no-such-object"])
    out, err = capsys.readouterr()
    assert rc != 0
    assert out == ""
    assert "no-such-object" in err and "Traceback" not in err


def test_json_flag_combined_short_options(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["-jp", "no-such-object"])
    out, _ = capsys.readouterr()
    assert rc != 0 and "error" in json.loads(out)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from mrc import __version__

    assert main(["--version"]) == 0
    assert __version__ in capsys.readouterr().out


def test_every_object_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    import click

    from mrc.ctl.cli import cli

    names = cli.list_commands(click.Context(cli))  # objects load lazily: ask the group, not .commands
    assert len(names) >= 10, names
    for name in names:
        assert main([name, "--help"]) == 0, name
        assert name in capsys.readouterr().out


def test_json_after_verb_gives_json_errors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["wire", "decode", str(tmp_path / "missing.pcap"), "-j"])
    out, _ = capsys.readouterr()
    assert rc != 0
    assert "missing.pcap" in json.loads(out)["error"]


def test_exit_code_of_a_command_is_kept(capsys: pytest.CaptureFixture[str]) -> None:
    import click

    from mrc.ctl.cli import cli

    @click.command("exit-three")
    @click.pass_context
    def exit_three(ctx: click.Context) -> None:
        ctx.exit(3)

    cli.add_command(exit_three)
    try:
        assert main(["exit-three"]) == 3
    finally:
        del cli.commands["exit-three"]
