"""Hooks for the whole suite.

The `root` marker (registered in pyproject.toml) is the one rule for tests that need root: a test marked
`pytest.mark.root(reason="...")` is skipped with "needs root: <reason>" when the suite does not run as
root, instead of each file carrying its own module-level skip. CI runs as root, so there they run
(docs/design.md §10). The `srv6` marker is for tests that build a testbed: as root on a kernel without
IPv6 SRv6 routes (CONFIG_IPV6_SEG6_LWTUNNEL, NEXT-C-SID) they are skipped naming what is missing, which
`mrc.dataplane.testbed.srv6_gap` probes once, instead of erroring on the first route."""

from __future__ import annotations

import os

import pytest

DEFAULT_ROOT_REASON = "namespaces, eBPF programs"


def root_skip_reason(marker: pytest.Mark) -> str:
    why = marker.kwargs.get("reason") or (marker.args[0] if marker.args else DEFAULT_ROOT_REASON)
    return f"needs root: {why}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.geteuid() != 0:
        for item in items:
            marker = item.get_closest_marker("root")
            if marker is not None:
                item.add_marker(pytest.mark.skip(reason=root_skip_reason(marker)))
        return
    srv6 = [item for item in items if item.get_closest_marker("srv6") is not None]
    if srv6:
        from mrc.dataplane.testbed import srv6_gap

        gap = srv6_gap()
        if gap is not None:
            for item in srv6:
                item.add_marker(pytest.mark.skip(reason=f"builds a testbed: {gap}"))
