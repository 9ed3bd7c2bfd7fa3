"""Output for mrcctl: one valid JSON document per call in -j mode, aligned tables otherwise.

Commands build a plain dict/list document and a renderer for humans; `Output.emit` picks one. Progress
goes to stderr and is suppressed in JSON mode so stdout stays machine-readable."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO, TypeVar

import click

Column = tuple[str, str]  # (key in the row dict, header)


@dataclass
class Output:
    json: bool = False
    pretty: bool = False
    # resolved when the Output is made, so redirected streams (tests, pipes) are honoured
    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)

    def emit(self, doc: Any, render: Callable[[Any], str] | None = None) -> None:
        if self.json:
            self.out.write(json.dumps(doc, indent=2 if self.pretty else None, sort_keys=False) + "\n")
        elif render is not None:
            text = render(doc)
            if text:
                self.out.write(text if text.endswith("\n") else text + "\n")
        else:
            self.out.write(json.dumps(doc, indent=2) + "\n")
        self.out.flush()

    def progress(self, message: str) -> None:
        """A progress line for long work (stderr; silent in JSON mode)."""
        if not self.json:
            self.err.write(message + "\n")
            self.err.flush()

    def error(self, message: str) -> None:
        if self.json:
            self.out.write(json.dumps({"error": message}) + "\n")
            self.out.flush()
        else:
            self.err.write(f"mrcctl: error: {message}\n")
            self.err.flush()


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def table(rows: Iterable[Mapping[str, Any]], columns: Sequence[Column]) -> str:
    """Left-aligned columns with a header line, like `ip -br` / `rdma` output."""
    cells = [[h for _, h in columns]]
    cells += [[_cell(r.get(k)) for k, _ in columns] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


_F = TypeVar("_F", bound=Callable[..., Any])


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    out = ctx.find_object(Output)
    if value and out is not None:
        out.json = True


def _set_pretty(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    out = ctx.find_object(Output)
    if value and out is not None:
        out.json = out.pretty = True


def json_option(f: _F) -> _F:
    """`-j` and `-p` after the verb as well as before the object (`mrcctl wire decode FILE -j`), the way
    operators type them (bpftool takes them anywhere); they switch the one `Output` of the call to JSON,
    `-p` indented (it implies -j, as in bpftool)."""
    f = click.option(
        "-p", "--pretty", is_flag=True, expose_value=False, is_eager=True, callback=_set_pretty,
        help="Indent JSON output; implies -j (same as mrcctl -p).",
    )(f)
    return click.option(
        "-j", "--json", is_flag=True, expose_value=False, is_eager=True, callback=_set_json,
        help="Output one JSON document (same as mrcctl -j).",
    )(f)


#: the formats a plot is written in (matplotlib picks the format from the name's suffix)
PLOT_SUFFIXES = (".png", ".pdf", ".svg")


def output_file(kind: str, suffixes: Sequence[str] = ()
                ) -> Callable[[click.Context, click.Parameter, Any], Any]:
    """A click callback for an option that names a file the command writes at its end (a report, a
    plot): refused at once, before any work, when it names a directory, lies in a directory that does
    not exist, or (with `suffixes`) does not end in a format the writer knows."""

    def check(_ctx: click.Context, _param: click.Parameter, value: Any) -> Any:
        if value is None:
            return None
        text = str(value)
        p = Path(text)
        if not text or text.endswith("/") or p.is_dir():
            raise click.BadParameter(f"{text!r} is a directory: name the {kind} file")
        if not p.parent.is_dir():
            raise click.BadParameter(f"{text!r}: no directory {str(p.parent)!r} to write the {kind} into")
        if suffixes and p.suffix.lower() not in suffixes:
            raise click.BadParameter(f"{text!r}: a {kind} is written as {', '.join(suffixes)} (end the name "
                                     "with one of them)")
        return value

    return check
