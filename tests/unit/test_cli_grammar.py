"""mrcctl's grammar and feel (docs/cli.md): prefixes, the `help` verb, -p implying -j, one error style,
objects imported lazily, shipped shell completion, `mrcd --version`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.shell_completion import get_completion_class

from mrc import __version__
from mrc.ctl.cli import COMPLETE_VAR, PROG, SHELLS, GrammarGroup, cli, completion_source, main

ROOT = Path(__file__).resolve().parents[2]
Cap = pytest.CaptureFixture[str]
HEAVY = ("numpy", "numba", "pyroute2", "scapy")


def _run(capsys: Cap, *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------------------ prefixes


def test_unique_prefixes_of_object_and_verb(capsys: Cap) -> None:
    full = _run(capsys, "-j", "wire", "show")
    assert full[0] == 0
    assert _run(capsys, "-j", "w", "s") == full  # `s` is also `sample`: show wins among several
    assert _run(capsys, "-j", "wi", "sh") == full
    assert _run(capsys, "-j", "wire", "sa", "--help")[1].startswith("Usage: mrcctl wire sample")


@pytest.mark.parametrize("obj", ["qp", "stats"])
def test_a_verb_given_as_an_argument_takes_a_prefix_too(capsys: Cap, obj: str) -> None:
    """`qp` and `stats` are commands whose verb is an argument, not groups: `mrcctl qp sh` is `qp show`
    all the same (resolved, not run: they ask whatever mrcd this machine has)."""
    top = click.Context(cli, info_name=PROG)
    _name, cmd, _rest = cli.resolve_command(top, [obj])
    assert cmd is not None
    for word in ("s", "sh", "show"):
        assert cmd.make_context(obj, [word], parent=top).params["verb"] == "show"
    with pytest.raises(click.BadParameter, match="'shown' is not 'show'"):
        cmd.make_context(obj, ["shown"], parent=top)


def test_prefixes_reach_nested_groups(capsys: Cap) -> None:
    rc, out, _ = _run(capsys, "te", "lin", "help")
    assert rc == 0 and out.startswith("Usage: mrcctl testbed link")
    rc, out, _ = _run(capsys, "si", "r", "fail", "--help")
    assert rc == 0 and out.startswith("Usage: mrcctl sim run failover")


def test_te_sh_is_testbed_show() -> None:
    """Resolved, not run: `testbed show` reads whatever testbed this machine has up."""
    top = click.Context(cli, info_name=PROG)
    name, group, rest = cli.resolve_command(top, ["te", "sh", "-j"])
    assert name == "testbed" and rest == ["sh", "-j"] and isinstance(group, click.Group)
    verb, cmd, _ = group.resolve_command(click.Context(group, info_name=name, parent=top), ["sh"])
    assert verb == "show" and cmd is group.commands["show"]


def test_an_object_without_its_verb_passes_its_words_to_the_default_verb(
        capsys: Cap, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/cli.md writes `ev [show] [--host H]`, `testbed [show] [--name N]`, `fault [show]`, `port [stats]
    [NODE]`: the options and arguments after an object go to its default verb. The groups used to take
    none ("No such option: --host", "No such command 'h0'")."""
    monkeypatch.setenv("MRC_RUN_DIR", str(tmp_path))
    assert _run(capsys, "wire", "-j") == _run(capsys, "wire", "show", "-j")
    for words in (("ev", "--host", "h0"), ("ev", "--name", "nosuch"), ("testbed", "--name", "nosuch"),
                  ("fault", "--name", "nosuch"), ("port", "h0", "--name", "nosuch")):
        verb = "stats" if words[0] == "port" else "show"
        rc, out, err = _run(capsys, "-j", *words)
        assert (rc, out, err) == _run(capsys, "-j", words[0], verb, *words[1:]), words
        assert rc == 1 and "error" in json.loads(out), words  # no testbed here: the verb's own error
    rc, _out, err = _run(capsys, "ev", "bogus")  # a mistyped verb is still named as one
    assert rc == 2 and "No such command 'bogus'" in err
    rc, out, _ = _run(capsys, "ev", "-h")
    assert rc == 0 and out.startswith("Usage: mrcctl ev [OPTIONS] [COMMAND]")


@pytest.mark.parametrize(("args", "word", "candidates"),
                         [(["s"], "s", "sim, stats"), (["testbed", "li"], "li", "link, list")])
def test_ambiguous_prefix_lists_the_candidates(capsys: Cap, args: list[str], word: str,
                                               candidates: str) -> None:
    rc, out, err = _run(capsys, *args)
    assert rc == 2 and out == ""
    assert f"'{word}' is ambiguous: {candidates}" in err
    rc, out, _ = _run(capsys, "-j", *args)
    assert rc == 2 and json.loads(out) == {"error": f"'{word}' is ambiguous: {candidates}"}


def test_errors_name_the_full_command_not_the_prefix(capsys: Cap) -> None:
    rc, _, err = _run(capsys, "w", "s", "--bogus")
    assert rc == 2 and "'mrcctl wire show --help'" in err


# -------------------------------------------------------------------------------------------- help verb


def test_help_verb_at_the_top(capsys: Cap) -> None:
    rc, out, _ = _run(capsys, "help")
    assert rc == 0 and out.startswith("Usage: mrcctl [OPTIONS] COMMAND")
    for name in ("wire", "testbed", "sim", "help", "completion"):
        assert f"  {name} " in out


def test_help_verb_of_an_object_prints_its_usage(capsys: Cap) -> None:
    rc, out, _ = _run(capsys, "wire", "help")
    assert rc == 0 and out.startswith("Usage: mrcctl wire")
    assert "decode" in out and "sample" in out
    assert _run(capsys, "wire", "help") == _run(capsys, "help", "wire")
    assert _run(capsys, "help", "wire", "decode")[1] == _run(capsys, "wire", "decode", "--help")[1]
    assert _run(capsys, "help", "w", "dec") == _run(capsys, "help", "wire", "decode")


def test_help_verb_errors(capsys: Cap) -> None:
    rc, _, err = _run(capsys, "help", "nope")
    assert rc == 2 and err.startswith("mrcctl: error: No such command 'nope'")
    rc, _, err = _run(capsys, "help", "qp", "x")
    assert rc == 2 and "'mrcctl qp' has no verbs" in err


def test_every_object_loads_with_the_grammar(capsys: Cap) -> None:
    """Objects are imported on first use, so this is where a broken cmd module shows; each group,
    nested ones included, has the prefix rules and the help verb."""
    ctx = click.Context(cli)
    names = [n for n in cli.list_commands(ctx) if n != "help"]
    assert {"wire", "testbed", "sim", "ev", "qp", "completion"} <= set(names)

    def groups(cmd: click.Command) -> list[click.Group]:
        if not isinstance(cmd, click.Group):
            return []
        return [cmd, *(g for sub in cmd.commands.values() for g in groups(sub))]

    for name in names:
        cmd = cli.get_command(ctx, name)
        assert cmd is not None, name
        for g in groups(cmd):
            assert isinstance(g, GrammarGroup), g.name
        assert main([name, "--help"]) == 0, name
        if isinstance(cmd, click.Group):
            assert main([name, "help"]) == 0, name
        assert f"mrcctl {name}" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------- -p


def test_pretty_implies_json(capsys: Cap) -> None:
    rc, out, _ = _run(capsys, "-p", "wire", "show")
    assert rc == 0 and out.startswith("{\n  ")
    assert json.loads(out) == json.loads(_run(capsys, "-j", "wire", "show")[1])
    assert json.loads(_run(capsys, "--pretty", "wire")[1]) == json.loads(out)


def test_pretty_after_the_verb(capsys: Cap, tmp_path: Path) -> None:
    assert _run(capsys, "wire", "show", "-p") == _run(capsys, "-p", "wire", "show")
    rc, out, err = _run(capsys, "wire", "decode", str(tmp_path / "missing.pcap"), "--pretty")
    assert rc == 1 and "missing.pcap" in json.loads(out)["error"] and err == ""


def test_pretty_errors_are_json(capsys: Cap) -> None:
    rc, out, err = _run(capsys, "-p", "no-such-object")
    assert rc == 2 and "no-such-object" in json.loads(out)["error"] and err == ""
    rc, out, err = _run(capsys, "wire", "decode", "--bogus", "-p")
    assert rc == 2 and json.loads(out) == {"error": "No such option '--bogus'."} and err == ""


# ---------------------------------------------------------------------------------------- error style


def test_click_usage_errors_in_mrcctl_style(capsys: Cap) -> None:
    rc, out, err = _run(capsys, "wire", "decode", "--bogus")
    assert rc == 2 and out == ""
    assert err == "mrcctl: error: No such option '--bogus'; see 'mrcctl wire decode --help'\n"
    rc, _, err = _run(capsys, "wire", "nope")
    assert rc == 2 and err == "mrcctl: error: No such command 'nope'; see 'mrcctl wire help'\n"
    rc, _, err = _run(capsys, "quant", "codebook", "--bits", "x")
    assert rc == 2 and err.startswith("mrcctl: error: ") and err.count("\n") == 1


def test_runtime_errors_in_the_same_style(capsys: Cap, tmp_path: Path) -> None:
    rc, out, err = _run(capsys, "wire", "decode", str(tmp_path / "missing.pcap"))
    assert rc == 1 and out == ""
    assert err.startswith("mrcctl: error: ") and "missing.pcap" in err and err.count("\n") == 1


def test_json_usage_errors_keep_the_contract(capsys: Cap) -> None:
    rc, out, err = _run(capsys, "-j", "wire", "decode", "--bogus")
    assert rc == 2 and err == ""
    assert json.loads(out) == {"error": "No such option '--bogus'."}


def test_group_without_verb_still_prints_its_help(capsys: Cap) -> None:
    rc, out, err = _run(capsys, "sim")
    assert rc == 2 and out == "" and err.startswith("Usage: mrcctl sim")


# ------------------------------------------------------------------------------------- lazy imports


def _modules_after(code: str) -> set[str]:
    """The heavy modules a fresh interpreter holds after running `code` (whatever `code` prints)."""
    probe = f"import sys\n{code}\nprint('HEAVY=' + ','.join(m for m in {HEAVY!r} if m in sys.modules))"
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                       cwd=ROOT, timeout=120)
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("HEAVY=")]
    return set(filter(None, line.removeprefix("HEAVY=").split(",")))


def test_importing_the_cli_imports_no_heavy_module() -> None:
    assert _modules_after("import mrc.ctl.cli") == set()


def test_light_commands_import_no_heavy_module() -> None:
    assert _modules_after("from mrc.ctl.cli import main\nassert main(['--version']) == 0") == set()
    assert _modules_after("from mrc.ctl.cli import main\nassert main(['-j', 'w', 's']) == 0") == set()


def test_top_level_completion_imports_no_object() -> None:
    code = ("from click.shell_completion import BashComplete\n"
            "from mrc.ctl.cli import cli\n"
            "names = [c.value for c in BashComplete(cli, {}, 'mrcctl', '_X').get_completions([], '')]\n"
            "assert {'wire', 'testbed', 'sim', 'help'} <= set(names), names\n"
            "assert not [m for m in sys.modules if m.startswith('mrc.ctl.cmd_')]")
    assert _modules_after(code) == set()


# --------------------------------------------------------------------------------------- completion


@pytest.mark.parametrize("shell", SHELLS)
def test_shipped_completion_is_what_click_generates(shell: str, capsys: Cap) -> None:
    shipped = (ROOT / "deploy" / "completion" / f"mrcctl.{shell}").read_text()
    assert shipped == completion_source(shell), f"regenerate it: mrcctl completion {shell} > {shell} file"
    rc, out, _ = _run(capsys, "completion", shell)
    assert rc == 0 and out == shipped
    assert f"{COMPLETE_VAR}={shell}_complete" in shipped


def test_completion_follows_prefixes() -> None:
    comp_cls = get_completion_class("bash")
    assert comp_cls is not None
    comp = comp_cls(cli, {}, PROG, COMPLETE_VAR)
    assert {c.value for c in comp.get_completions(["wire"], "")} == {"decode", "help", "sample", "show"}
    assert "--json" in {c.value for c in comp.get_completions(["w", "s"], "--")}
    assert {c.value for c in comp.get_completions(["te"], "li")} == {"link", "list"}


# --------------------------------------------------------------------------------------------- mrcd


def test_mrcd_version(capsys: Cap) -> None:
    from mrc.ctl.daemon import main as mrcd_main

    with pytest.raises(SystemExit) as e:
        mrcd_main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"mrcd {__version__}\n"


# ------------------------------------------------------------------------- errors before any work


def test_json_error_for_a_group_without_its_verb(capsys: Cap) -> None:
    rc, out, err = _run(capsys, "-j", "sim")
    assert rc == 2 and err == ""
    assert json.loads(out) == {"error": "'mrcctl sim' needs a verb: one of fluid, loopback, run"}
    rc, out, err = _run(capsys, "sim")  # for people: the group's help, as before
    assert rc == 2 and "Usage: mrcctl sim" in out + err


@pytest.mark.parametrize("words", [("qp", "help"), ("stats", "help"), ("allreduce", "help"),
                                   ("help", "qp", "show"), ("help", "stats", "sh")])
def test_help_verb_on_commands_without_sub_verbs(capsys: Cap, words: tuple[str, ...]) -> None:
    rc, out, _ = _run(capsys, *words)
    obj = words[1] if words[0] == "help" else words[0]
    assert rc == 0 and out.startswith(f"Usage: mrcctl {obj} "), out


@pytest.mark.parametrize(("args", "problem"), [
    (("allreduce", "--size", "9" * 400), "out of range"),
    (("allreduce", "--size", "64K", "--bits", "1e-17"), "bit budget must be in [0.015625, 8]"),
    (("allreduce", "--size", "64K", "--bits", "0.03"), "bit budget is at least 0.0625"),
    (("allreduce", "--size", "64K", "--report", "/"), "is a directory"),
    (("allreduce", "--size", "64K", "--report", "/nonexistent-dir/r.json"), "no directory"),
    (("sim", "run", "permutation", "--hosts", "4", "--plot", "x.txt"), "written as .png, .pdf, .svg"),
    (("sim", "fluid", "step-tail", "--plot", "/"), "is a directory"),
])
def test_bad_values_are_one_json_error_before_any_work(capsys: Cap, args: tuple[str, ...],
                                                       problem: str) -> None:
    rc, out, err = _run(capsys, "-j", *args)
    assert rc != 0 and err == ""  # no traceback, no progress: refused before the run started
    assert problem in json.loads(out)["error"]


def test_json_flag_after_a_fluid_verb(capsys: Cap) -> None:
    rc, out, _ = _run(capsys, "sim", "fluid", "permutation", "--hosts", "128", "-j")
    assert rc == 0 and json.loads(out)["experiment"] == "permutation"


def test_fluid_cluster_by_the_shipped_name_from_any_directory(
    capsys: Cap, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pip user has no deploy/ folder: `--cluster cluster-8k.toml` names the shipped example (it was
    refused as a path that does not exist)."""
    monkeypatch.chdir(tmp_path)
    rc, out, _ = _run(capsys, "-j", "sim", "fluid", "permutation", "--cluster", "cluster-8k.toml")
    assert rc == 0, out
    assert json.loads(out)["config"]["hosts"] == 8192
    rc, out, _ = _run(capsys, "-j", "sim", "fluid", "permutation", "--cluster", "cluster-9k.toml")
    assert rc != 0 and "cluster-9k.toml: cannot read" in json.loads(out)["error"]


def test_sim_run_topology_by_the_shipped_name(
    capsys: Cap, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, out, _ = _run(capsys, "-j", "sim", "run", "permutation", "--topology", "small.toml",
                      "--duration", "20us", "--warmup", "5us")
    assert rc == 0, out
    assert json.loads(out)["config"]["fabric"]["file"].endswith("small.toml")


def test_fluid_plot_without_matplotlib_is_a_clear_error(
    capsys: Cap, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`pip install mrc` has no matplotlib: step-tail --plot ended in a ModuleNotFoundError traceback."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    rc, out, err = _run(capsys, "-j", "sim", "fluid", "step-tail", "--hosts", "128", "--planes", "2",
                        "--draws", "2", "--plot", str(tmp_path / "x.png"))
    assert rc != 0 and "Traceback" not in err
    assert "pip install 'mrc[plot]'" in json.loads(out)["error"]


@pytest.mark.parametrize("state", ["{}", "[1]", '{"name": "bad", "topology": {}, "links": {"x": {}}}'])
def test_damaged_testbed_state_is_a_clear_error(capsys: Cap, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                state: str) -> None:
    monkeypatch.setenv("MRC_RUN_DIR", str(tmp_path))
    (tmp_path / "testbed").mkdir()
    (tmp_path / "testbed" / "bad.json").write_text(state)
    rc, out, _ = _run(capsys, "-j", "testbed", "show", "--name", "bad")
    assert rc in (1, 2)  # 2: a topology error of the record's topology (a ConfigError)
    msg = json.loads(out)["error"]
    assert "bad.json" in msg and ("damaged testbed state" in msg or "topology" in msg), msg


def test_mrcd_check_config_into_a_closed_pipe_is_not_an_error() -> None:
    example = ROOT / "deploy" / "mrcd.clos.example.toml"
    r = subprocess.run(f"{sys.executable} -m mrc.ctl.daemon --check-config '{example}' | head -c 1",
                       shell=True, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr
