"""docs/design.md §2: imports flow mrc.ctl -> mrc.dataplane -> mrc.*; only dataplane/ touches bcc/pyroute2."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KERNEL_MODULES = {"bcc", "pyroute2"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _files(folder: str) -> list[Path]:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"no Python files under {folder}/"
    return files


def test_pure_core_never_imports_kernel_or_upper_layers() -> None:
    for f in _files("mrc"):
        for name in _imports(f):
            top = name.split(".")[0]
            assert top not in KERNEL_MODULES, f"{f.relative_to(ROOT)} imports {name}"
            assert not name.startswith(("mrc.dataplane", "mrc.ctl")), f"{f.relative_to(ROOT)} imports {name}"


def test_dataplane_never_imports_ctl() -> None:
    for f in _files("dataplane"):
        for name in _imports(f):
            assert not name.startswith("mrc.ctl"), f"{f.relative_to(ROOT)} imports {name}"


def test_ctl_reaches_kernel_only_through_dataplane() -> None:
    for f in _files("ctl"):
        for name in _imports(f):
            assert name.split(".")[0] not in KERNEL_MODULES, f"{f.relative_to(ROOT)} imports {name}"
