"""Helpers shared by the netns tests that start rank processes (all-reduce and DDP ranks over MRC)."""

from __future__ import annotations

from pathlib import Path


def rank_pids(name: str, module: str = "mrc.ctl.allreduce_rank") -> list[int]:
    """Live processes running `python -m <module>` for testbed `name` (their command line names its
    host namespaces, `<name>-<host>`)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes()
        except OSError:
            continue
        if module.encode() in cmd and f"{name}-".encode() in cmd:
            out.append(int(d.name))
    return out
