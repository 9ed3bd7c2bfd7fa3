"""Where the eBPF C sources are at run time.

`bpf/` ships as the package `mrc._bpf` (package data), so the same lookup works from an editable
install (the finder maps it to the checkout's bpf/ folder) and from a wheel (site-packages). BCC
needs real file paths, which both layouts give."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from mrc.errors import MrcError


def _root() -> Path:
    root = resources.files("mrc._bpf")
    path = Path(str(root))
    if not path.is_dir():
        raise MrcError(f"eBPF sources not found at {path}: reinstall mrc (pip install -e .)")
    return path


def bpf_include_dir() -> Path:
    """The folder to pass to BCC as -I (holds mrc_abi.h and the one-concern headers)."""
    return _root() / "include"


def bpf_source(name: str) -> Path:
    """Path of a shipped eBPF source or header, e.g. bpf_source("include/mrc_abi.h")."""
    path = _root() / name
    if not path.is_file():
        raise MrcError(f"eBPF source {name!r} is not shipped with mrc (looked in {_root()})")
    return path
