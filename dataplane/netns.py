"""Network-namespace helpers: create/remove, sysctls, sockets and processes inside a namespace.

Everything goes through pyroute2 or the kernel's own files (/run/netns, /proc); no `ip` subprocess."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from pyroute2 import netns as _netns

NETNS_RUN_DIR = Path("/run/netns")
#: The caller's own network namespace, where a name is expected: what mrcd on a real host (or started with
#: `ip netns exec`) works in. Records of what was made there also keep its inode (`own_inode`), so that
#: another process, in another namespace, never mistakes its own namespace for it (`resolve`).
HERE = ""


def exists(name: str) -> bool:
    return name == HERE or (NETNS_RUN_DIR / name).exists()


def own_inode() -> tuple[int, int]:
    """(device, inode) of the calling thread's network namespace."""
    st = os.stat("/proc/thread-self/ns/net")
    return (st.st_dev, st.st_ino)


def name_of(ino: tuple[int, int]) -> str | None:
    """The namespace with inode `ino` as a name this module takes: HERE when it is the caller's, the
    /run/netns name when it has one, else None (unreachable by name)."""
    if own_inode() == ino:
        return HERE
    if NETNS_RUN_DIR.is_dir():
        for entry in sorted(NETNS_RUN_DIR.iterdir()):
            if inode(entry.name) == ino:
                return entry.name
    return None


def listing() -> list[str]:
    return sorted(_netns.listnetns())


def create(name: str) -> None:
    if exists(name):
        raise FileExistsError(errno.EEXIST, "network namespace exists", str(NETNS_RUN_DIR / name))
    _netns.create(name)


def remove(name: str) -> None:
    """Remove a named namespace (its links, routes and qdiscs go with it once no process holds it)."""
    with contextlib.suppress(FileNotFoundError):
        _netns.remove(name)


def inode(name: str) -> tuple[int, int] | None:
    try:
        st = os.stat(NETNS_RUN_DIR / name)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


def pids_in(names: Iterable[str]) -> list[int]:
    """PIDs of processes whose network namespace is one of ``names`` (like `ip netns pids`)."""
    wanted = {i for i in (inode(n) for n in names) if i is not None}
    if not wanted:
        return []
    me = os.getpid()
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            st = os.stat(f"/proc/{entry}/ns/net")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in wanted:
            out.append(int(entry))
    return out


def kill_processes(names: Iterable[str], grace_s: float = 2.0) -> list[int]:
    """SIGTERM, then SIGKILL after ``grace_s``, every process living in the namespaces ``names``."""
    names = list(names)
    pids = pids_in(names)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and pids_in(names):
        time.sleep(0.05)
    for pid in pids_in(names):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return pids


@contextlib.contextmanager
def entered(name: str) -> Iterator[None]:
    """Run the body with the *current thread* inside namespace ``name`` (setns is per thread)."""
    if name == HERE:
        yield
        return
    back = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    try:
        _netns.setns(name, flags=0)
        try:
            yield
        finally:
            _netns.setns(back, flags=0)
    finally:
        os.close(back)


def set_sysctls(name: str, values: dict[str, str | int]) -> None:
    """Write net.* sysctls of namespace ``name`` (keys like ``net.ipv6.conf.all.forwarding``)."""
    with entered(name):
        for key, value in values.items():
            path = Path("/proc/sys") / key.replace(".", "/")
            path.write_text(f"{value}\n")


def get_sysctl(name: str, key: str) -> str:
    with entered(name):
        return (Path("/proc/sys") / key.replace(".", "/")).read_text().strip()


def socket_in(name: str, family: int, kind: int, proto: int = 0) -> socket.socket:
    """A socket that lives in namespace ``name`` (it stays there after the thread leaves)."""
    if name == HERE:
        return socket.socket(family, kind, proto)
    with entered(name):
        return socket.socket(family, kind, proto)


def enter_for_exec(name: str) -> None:
    """Move the calling (single-threaded) process into ``name`` for good, e.g. before os.execvp."""
    if not exists(name):
        raise FileNotFoundError(errno.ENOENT, "no such network namespace", str(NETNS_RUN_DIR / name))
    _netns.setns(name, flags=0)


def ipr(name: str) -> Any:
    """A pyroute2 IPRoute bound to namespace ``name`` (HERE: the caller's), its netlink socket made with
    the calling thread inside the namespace (`entered`). Not pyroute2's ``netns=``, which forks a child
    process for every socket: a fork from one thread while another runs a multithreaded OpenBLAS call
    hangs that call for good (OpenBLAS's fork handler stops the worker threads the call waits on). That
    hung ``mrcctl allreduce`` when its link-heal timer fired during an iteration's vNMSE."""
    from pyroute2 import IPRoute

    if name == HERE:
        return IPRoute()
    if not exists(name):
        raise FileNotFoundError(errno.ENOENT, "no such network namespace", str(NETNS_RUN_DIR / name))
    with entered(name):
        return IPRoute()
