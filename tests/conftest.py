"""Hooks for the whole suite.

The `root` marker (registered in pyproject.toml) is the one rule for tests that need root: a test marked
`pytest.mark.root(reason="...")` is skipped with "needs root: <reason>" when the suite does not run as
root, instead of each file carrying its own module-level skip. CI runs as root, so there they run
(docs/design.md §10)."""

from __future__ import annotations

import os

import pytest

DEFAULT_ROOT_REASON = "namespaces, eBPF programs"


def root_skip_reason(marker: pytest.Mark) -> str:
    why = marker.kwargs.get("reason") or (marker.args[0] if marker.args else DEFAULT_ROOT_REASON)
    return f"needs root: {why}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() == 0:
        return
    for item in items:
        marker = item.get_closest_marker("root")
        if marker is not None:
            item.add_marker(pytest.mark.skip(reason=root_skip_reason(marker)))
