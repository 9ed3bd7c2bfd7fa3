"""The `mrcd` command: `mrc.ctl.daemon.main`, imported when it runs, so that a missing package of the
install (pyroute2, which the daemon's data-plane modules import at load) is one error line saying what
to install instead of an import traceback (mrcctl does the same: `cli.INSTALL_HINTS`)."""

from __future__ import annotations

import sys

from .cli import INSTALL_HINTS


def main(argv: list[str] | None = None) -> int:
    try:
        from .daemon import main as daemon_main
    except ModuleNotFoundError as e:
        dep = (e.name or "").partition(".")[0]
        if dep not in INSTALL_HINTS:
            raise  # not an install problem we know: a bug, shown whole
        print(f"mrcd: error: {dep} is not importable: {INSTALL_HINTS[dep]}", file=sys.stderr)
        return 1
    return daemon_main(argv)


if __name__ == "__main__":
    sys.exit(main())
