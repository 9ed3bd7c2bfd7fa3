"""mrcctl: the operator CLI, in the grammar of ip/tc/bpftool/rdma::

    mrcctl [-j|--json] [-p|--pretty] OBJECT [VERB] [ARGS]

Each OBJECT is a click group (or command) named <object> in its own module `cmd_<object>.py`. The
modules are found by name and imported only when their object runs, so `mrcctl --version` or `mrcctl wire
show` never pay for numpy, pyroute2 or scapy (docs/cli.md measures it: bench/cli_start.py).

The grammar, the same at every level (docs/cli.md):

- a unique prefix names an object or a verb (`mrcctl w s` is `mrcctl wire show`); a prefix of several
  verbs one of which is `show` means `show` (as `ip` lists its show verb first); any other ambiguous
  prefix is a usage error that lists the candidates;
- `help` is a verb of every group (`mrcctl help`, `mrcctl wire help`, `mrcctl help wire decode`);
- `show` is the default verb where an object has one;
- `-p` (pretty) implies `-j`, as in bpftool;
- errors are one line `mrcctl: error: ...` on stderr, or {"error": ...} on stdout with -j; exit status 2
  for usage errors (click's and ours), the error's own code (1 for runtime errors) otherwise; never a
  traceback for bad input.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import click
from click.shell_completion import CompletionItem, get_completion_class

from mrc import __version__
from mrc.errors import MrcError

from .output import Output

PROG = "mrcctl"
COMPLETE_VAR = "_MRCCTL_COMPLETE"
PREFERRED_VERB = "show"
HELP_VERB = "help"
SHELLS = ("bash", "zsh", "fish")
#: What to install for a package of the venv that objects import when they run, never when mrcctl
#: starts (pyroute2: every object that reaches a testbed or an mrcd, through mrc.dataplane). Its absence
#: is a broken install, told as one error line saying what to install, not an import traceback.
INSTALL_HINTS: Final = {"pyroute2": "run `make setup` (or pip install pyroute2)"}


if TYPE_CHECKING:
    _StrChoice = click.Choice[str]
else:  # click < 8.2 has no generic Choice at run time
    _StrChoice = click.Choice


class PrefixChoice(_StrChoice):
    """A click.Choice that also takes a unique prefix of one of its values: the grammar of the groups'
    verbs for a command whose verb is an argument (`mrcctl qp sh` is `mrcctl qp show`)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value and value not in self.choices:
            hits = [c for c in self.choices if isinstance(c, str) and c.startswith(value)]
            if len(hits) == 1:
                value = hits[0]
        return super().convert(value, param, ctx)


#: The verb an OBJECT runs when none is given (`mrcctl ev` is `mrcctl ev show`). The options and
#: arguments after the object go to it, as the docs write them (`mrcctl ev [show] [--host H]`, `mrcctl
#: port [stats] [NODE]`): a first word that is no verb (or prefix of one) of the object, or an option
#: other than help, starts the default verb's arguments.
DEFAULT_VERB: Final = {"ev": "show", "fault": "show", "port": "stats", "prog": "show", "quant": "show",
                       "testbed": "show", "wire": "show"}


class GrammarGroup(click.Group):
    """A click group with mrcctl's grammar: prefixes of verbs and the `help` verb.

    Kept in one class (rather than repeated in every cmd module) so that every level behaves alike;
    groups that the cmd modules define with a plain `click.group()` are adopted into it when loaded
    (`adopt`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), HELP_VERB})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == HELP_VERB and HELP_VERB not in self.commands:
            return _help_command()
        return super().get_command(ctx, cmd_name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        top_level = ctx.parent is not None and ctx.parent.parent is None
        verb = DEFAULT_VERB.get(self.name or "") if top_level else None
        if verb is not None and not ctx.resilient_parsing and self._starts_default_verb(ctx, verb, args):
            args = [verb, *args]
        return super().parse_args(ctx, args)

    def _starts_default_verb(self, ctx: click.Context, verb: str, args: list[str]) -> bool:
        if not args:
            return True
        word = args[0]
        if word in ctx.help_option_names:
            return False
        if word.startswith("-"):
            return True  # an OBJECT group has no options of its own but help
        # a word: the default verb's argument if it takes one and the word names no verb ("No such
        # command" otherwise, the clearer error for a mistyped verb)
        cmd = self.get_command(ctx, verb)
        takes_words = cmd is not None and any(isinstance(p, click.Argument) for p in cmd.params)
        return takes_words and self.get_command(ctx, word) is None and self.match_prefix(ctx, word) is None

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        """Exact names first, then prefixes; the resolved (full) name becomes the context's name, so
        usage lines and errors say `mrcctl wire show`, not `mrcctl w s`."""
        word = args[0]
        if word and not word.startswith("-") and self.get_command(ctx, word) is None:
            full = self.match_prefix(ctx, word)
            if full is not None:
                args = [full, *args[1:]]
        name, cmd, rest = super().resolve_command(ctx, args)
        if cmd is not None and not isinstance(cmd, click.Group) and rest == [HELP_VERB]:
            rest = ["--help"]  # `mrcctl allreduce help`, `mrcctl qp help`: a command's help, as a group's
        return name, cmd, rest

    def match_prefix(self, ctx: click.Context, word: str) -> str | None:
        """The one name that `word` abbreviates, `show` among several, or None when nothing matches
        (click then says "No such command"). Several other candidates are a usage error naming them,
        except while completing (resilient parsing), where nothing may raise."""
        names = [n for n in self.list_commands(ctx) if n.startswith(word)]
        if len(names) == 1:
            return names[0]
        if PREFERRED_VERB in names:
            return PREFERRED_VERB
        if names and not ctx.resilient_parsing:
            raise click.UsageError(f"'{word}' is ambiguous: {', '.join(names)}", ctx)
        return None


def adopt(cmd: click.Command) -> click.Command:
    """Give a plain click group (and its plain sub-groups) mrcctl's grammar.

    The cmd modules write `@click.group()`; swapping the class of such a group is safe because
    GrammarGroup adds behaviour, no state. A group of some other subclass is left as its author made
    it."""
    if type(cmd) is click.Group:
        cmd.__class__ = GrammarGroup
    if isinstance(cmd, click.Group):
        for sub in cmd.commands.values():
            adopt(sub)
    return cmd


def _verbs_of(cmd: click.Command) -> list[str]:
    """The verbs (and their unique prefixes) of a command that takes its verb as a PrefixChoice argument
    (`mrcctl qp [show]`)."""
    out: list[str] = []
    for p in cmd.params:
        if isinstance(p, click.Argument) and isinstance(p.type, PrefixChoice):
            for c in p.type.choices:
                out.extend(str(c)[:k] for k in range(1, len(str(c)) + 1))
    return out


def _help_command() -> click.Command:
    """`GROUP help [VERB ...]`: the help of the group, or of the verb path below it (prefixes allowed).
    Made per lookup, so that no group shares a command object with another."""

    @click.command(HELP_VERB)
    @click.argument("words", nargs=-1)
    @click.pass_context
    def help_verb(ctx: click.Context, words: tuple[str, ...]) -> None:
        """Show the usage of this object, or of OBJECT/VERB below it."""
        target = ctx.parent if ctx.parent is not None else ctx
        for word in words:
            group = target.command
            if not isinstance(group, click.Group):
                if word in _verbs_of(group):  # `mrcctl help qp show`: qp takes its verb as an argument
                    continue
                raise click.UsageError(f"'{target.command_path}' has no verbs (no '{word}')", target)
            name, cmd, _ = group.resolve_command(target, [word])
            if cmd is None or name is None:  # resolve_command raises first, unless completing
                raise click.UsageError(f"no such command '{word}'", target)
            target = click.Context(cmd, info_name=name, parent=target)
        click.echo(target.get_help(), color=target.color)

    return help_verb


class LazyObjects(GrammarGroup):
    """The top level: OBJECTs known by the names of their modules, each imported on first use.

    An import error or a module without its command surfaces when that object is used (and in
    tests/unit/test_cli_grammar.py, which loads every object), never hides."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lazy: dict[str, str] | None = None

    def lazy_objects(self) -> dict[str, str]:
        """OBJECT name -> module, from the file names of `ctl/cmd_*.py` (nothing is imported)."""
        if self._lazy is None:
            from mrc import ctl

            self._lazy = {
                info.name.removeprefix("cmd_"): f"{ctl.__name__}.{info.name}"
                for info in pkgutil.iter_modules(ctl.__path__)
                if info.name.startswith("cmd_")
            }
        return self._lazy

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.lazy_objects()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None or cmd_name not in self.lazy_objects():
            return cmd
        module = importlib.import_module(self.lazy_objects()[cmd_name])
        cmd = getattr(module, cmd_name, None)
        if not isinstance(cmd, click.Command):
            raise RuntimeError(f"{module.__name__} must define a click command or group named {cmd_name!r}")
        self.add_command(adopt(cmd), cmd_name)
        return cmd

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        """Object names without importing every object (click's default asks each for its help
        text, which would cost a second per TAB); options as click completes them."""
        items = [CompletionItem(n) for n in self.list_commands(ctx) if n.startswith(incomplete)]
        return items + click.Command.shell_complete(self, ctx, incomplete)


@click.group(cls=LazyObjects, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-j", "--json", "as_json", is_flag=True, help="Output one JSON document.")
@click.option("-p", "--pretty", is_flag=True, help="Indent JSON output (implies -j).")
@click.version_option(__version__, "-V", "--version", prog_name=PROG)
@click.pass_context
def cli(ctx: click.Context, as_json: bool, pretty: bool) -> None:
    """Operate MRC: packets, testbeds, dataplane, benchmarks.

    OBJECT and VERB may be abbreviated to a unique prefix (mrcctl w s = mrcctl wire show); 'help' is a
    verb at every level."""
    ctx.obj = Output(json=as_json or pretty, pretty=pretty)


def completion_source(shell: str) -> str:
    """The completion script click generates for `shell` (what `_MRCCTL_COMPLETE=<shell>_source
    mrcctl` prints); deploy/completion/ ships these, and a test keeps them equal."""
    comp_cls = get_completion_class(shell)
    if comp_cls is None:
        raise click.UsageError(f"no completion for shell {shell!r} (one of: {', '.join(SHELLS)})")
    return comp_cls(cli, {}, PROG, COMPLETE_VAR).source()


@cli.command("completion")
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL (bash, zsh, fish).

    bash: mrcctl completion bash > /etc/bash_completion.d/mrcctl (or deploy/completion/mrcctl.bash)."""
    click.echo(completion_source(shell), nl=False)


def _json_requested(argv: Sequence[str]) -> bool:
    """Whether the call wants JSON, found before click parses anything, so that even errors found while
    parsing come out as JSON: -j/--json or -p/--pretty (which implies -j) anywhere before `--` (ip
    takes them first, bpftool anywhere; users also type them after the verb)."""
    for a in argv:
        if a == "--":
            break
        if a in ("-j", "--json", "-p", "--pretty", "-jp", "-pj"):
            return True
    return False


# click >= 8.2 raises this for a group called without a verb; its message is the group's help
_NO_ARGS_IS_HELP: tuple[type[click.UsageError], ...] = tuple(
    c for c in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if c is not None
)


def _usage_hint(e: click.UsageError) -> str:
    """Where to read the grammar of the command that failed: `; see 'mrcctl wire help'` for a group,
    `; see 'mrcctl wire decode --help'` for a verb."""
    if e.ctx is None:
        return ""
    if isinstance(e.ctx.command, click.Group):
        return f"; see '{e.ctx.command_path} {HELP_VERB}'"
    return f"; see '{e.ctx.command_path} --help'"


def main(argv: Sequence[str] | None = None) -> int:
    """Run mrcctl on `argv`; every error, click's usage errors included, leaves as one line (or one
    JSON object) and an exit status, never a traceback."""
    args = list(sys.argv[1:] if argv is None else argv)
    out = Output(json=_json_requested(args))
    try:
        rv = cli.main(args=args, prog_name=PROG, complete_var=COMPLETE_VAR, standalone_mode=False)
        # without standalone mode click *returns* the code of ctx.exit(n) instead of raising it
        if isinstance(rv, int) and not isinstance(rv, bool):
            return rv
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except click.exceptions.Abort:
        out.error("aborted")
        return 130
    except _NO_ARGS_IS_HELP as e:
        if not out.json:
            e.show()
            return int(e.exit_code)
        # -j: one JSON document, as for every other error (the text help is for people)
        group = e.ctx.command if e.ctx is not None else None
        verbs = sorted(group.commands) if isinstance(group, click.Group) else []
        path = e.ctx.command_path if e.ctx is not None else PROG
        out.error(f"'{path}' needs a verb" + (f": one of {', '.join(verbs)}" if verbs else ""))
        return int(e.exit_code) or 2
    except click.UsageError as e:
        message = e.format_message()
        out.error(message if out.json else message.rstrip(".") + _usage_hint(e))
        return int(e.exit_code) or 2
    except click.ClickException as e:
        out.error(e.format_message())
        return int(e.exit_code) or 1
    except MrcError as e:
        out.error(str(e))
        return e.exit_code
    except ModuleNotFoundError as e:
        dep = (e.name or "").partition(".")[0]
        if dep not in INSTALL_HINTS:
            raise  # not an install problem we know: a bug, shown whole
        out.error(f"{dep} is not importable: {INSTALL_HINTS[dep]}")
        return 1
    except OSError as e:
        out.error(f"{e.strerror or e}{': ' + str(e.filename) if e.filename else ''}")
        return 1
    except MemoryError:  # sizes the options allow beyond this machine's memory: one line, not a traceback
        out.error("out of memory: this machine cannot hold what the options ask for (smaller sizes, fewer "
                  "ranks or dimensions)")
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
