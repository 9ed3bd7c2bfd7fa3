"""Errors that reach an operator. Each carries an exit code; `mrcctl` prints them as one clear line,
or as {"error": ...} in JSON mode."""

from __future__ import annotations


class MrcError(Exception):
    """Base class: a problem the user can act on (bad input, missing feature, failed setup step)."""

    exit_code = 1


class ConfigError(MrcError):
    """A bad configuration or topology file: the message names the file, the line/key and the problem."""

    exit_code = 2


class UsageError(MrcError):
    """Bad command-line arguments."""

    exit_code = 2
