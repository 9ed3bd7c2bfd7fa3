"""`netns.ipr` binds a pyroute2 socket to a namespace without forking (root).

pyroute2's own ``IPRoute(netns=...)`` forks a child process per socket. A fork from one thread while
another runs a multithreaded OpenBLAS call hangs that call for good (OpenBLAS's fork handler stops the
worker threads the call waits on): `mrcctl allreduce` hung in an iteration's vNMSE when its link-heal
timer thread opened the testbed's sockets. The second test is that situation, under a timeout."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from mrc.dataplane import netns

pytestmark = [pytest.mark.root(reason="network namespaces"), pytest.mark.netns]

_FORKS: list[int] = []
_COUNTING = threading.Event()
os.register_at_fork(before=lambda: _FORKS.append(1) if _COUNTING.is_set() else None)


@pytest.fixture
def ns() -> Iterator[str]:
    name = "ipr" + secrets.token_hex(4)
    netns.create(name)
    try:
        yield name
    finally:
        netns.remove(name)


def _links(name: str) -> list[str]:
    ipr = netns.ipr(name)
    try:
        return sorted(str(lk.get_attr("IFLA_IFNAME")) for lk in ipr.get_links())
    finally:
        ipr.close()


def test_ipr_binds_the_namespace_without_forking(ns: str) -> None:
    got: list[list[str]] = []
    _FORKS.clear()
    _COUNTING.set()
    try:
        got.append(_links(ns))
        t = threading.Thread(target=lambda: got.append(_links(ns)))
        t.start()
        t.join(30)
    finally:
        _COUNTING.clear()
    assert got == [["lo"], ["lo"]]  # the new namespace's links, not the caller's
    assert _FORKS == []
    assert "lo" in _links(netns.HERE)
    with pytest.raises(FileNotFoundError, match="no such network namespace"):
        netns.ipr(ns + "-missing")


_RACE = """
import sys, threading
import numpy as np
from mrc.dataplane import netns

ns = sys.argv[1]
x = np.random.default_rng(1).standard_normal(1 << 22)
stop = threading.Event()

def open_sockets():
    while not stop.is_set():
        netns.ipr(ns).close()

threading.Thread(target=open_sockets, daemon=True).start()
for _ in range(200):
    assert float(np.dot(x, x)) > 0
stop.set()
print("done")
"""


def test_sockets_opened_in_a_thread_do_not_hang_blas_in_another(ns: str) -> None:
    # in a child process, so that a hang (the main thread spinning inside OpenBLAS, where no signal
    # handler runs) fails this test instead of stopping the run
    proc = subprocess.Popen([sys.executable, "-c", _RACE, ns], stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
        pytest.fail("np.dot hung while another thread opened namespace sockets")
    assert proc.returncode == 0 and out.strip() == "done"
