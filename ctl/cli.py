"""mrcctl: the operator CLI, in the grammar of ip/tc/bpftool/rdma::

    mrcctl [-j|--json] [-p|--pretty] OBJECT [VERB] [ARGS]

Each OBJECT is a click group named <object> in its own module `cmd_<object>.py`, found by
`_register`; `show` is the default verb where an object has one. Errors print one clear line (or
{"error": ...} with -j) and exit non-zero; no traceback reaches the user for bad input.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from mrc import __version__
from mrc.errors import MrcError

from .output import Output


class DefaultVerbGroup(click.Group):
    """A group that runs `show` when no verb is given (`mrcctl wire` == `mrcctl wire show`)."""

    default_verb = "show"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if self.default_verb in self.commands and (not args or args[0] not in self.commands) and not (
            args and args[0] in ("--help", "-h")
        ):
            args = [self.default_verb, *args]
        return super().parse_args(ctx, args)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-j", "--json", "as_json", is_flag=True, help="Output one JSON document.")
@click.option("-p", "--pretty", is_flag=True, help="Indent JSON output.")
@click.version_option(__version__, "-V", "--version", prog_name="mrcctl")
@click.pass_context
def cli(ctx: click.Context, as_json: bool, pretty: bool) -> None:
    """Operate MRC: packets, testbeds, dataplane, benchmarks."""
    ctx.obj = Output(json=as_json, pretty=pretty)


def _register() -> None:
    """Add every OBJECT: the module `ctl/cmd_<object>.py` defines a click group named `<object>`.
    Discovery keeps this file out of every feature's diff; an import error surfaces, never hides."""
    import importlib
    import pkgutil

    from mrc import ctl

    for info in sorted(pkgutil.iter_modules(ctl.__path__), key=lambda i: i.name):
        if not info.name.startswith("cmd_"):
            continue
        module = importlib.import_module(f"{ctl.__name__}.{info.name}")
        obj = info.name.removeprefix("cmd_")
        group = getattr(module, obj, None)
        if not isinstance(group, click.Command):
            raise RuntimeError(f"{module.__name__} must define a click command or group named {obj!r}")
        cli.add_command(group, obj)


_register()


def _json_requested(argv: Sequence[str]) -> bool:
    """-j/--json anywhere before `--` (ip accepts it first; users also type it after the verb), so
    that even errors found while parsing come out as JSON."""
    for a in argv:
        if a == "--":
            break
        if a in ("-j", "--json", "-jp", "-pj"):
            return True
    return False


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    out = Output(json=_json_requested(args))
    try:
        rv = cli.main(args=args, prog_name="mrcctl", standalone_mode=False)
        # without standalone mode click *returns* the code of ctx.exit(n) instead of raising it
        if isinstance(rv, int) and not isinstance(rv, bool):
            return rv
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except click.exceptions.Abort:
        out.error("aborted")
        return 130
    except click.ClickException as e:
        if out.json:
            out.error(e.format_message())
        else:
            e.show()
        return int(e.exit_code) or 2
    except MrcError as e:
        out.error(str(e))
        return e.exit_code
    except OSError as e:
        out.error(f"{e.strerror or e}{': ' + str(e.filename) if e.filename else ''}")
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
