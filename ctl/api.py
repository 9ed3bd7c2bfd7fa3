"""mrcctl's side of the control socket: find the mrcds meant and ask them (docs/daemon.md).

On a testbed, every host's mrcd (``--name``, ``--host``). On a real host, the one local mrcd started from
its configuration file: the socket in ``$MRC_SOCKET``, else the default ``/run/mrc/mrcd.sock`` when no
testbed is up; its host is the name it gives (`LOCAL` stands for the testbed name then)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import click

from mrc.dataplane import testbed as tbmod
from mrc.dataplane.client import MrcClient, check_socket_path, socket_path
from mrc.errors import MrcError
from mrc.hostconfig import DEFAULT_SOCKET

from . import daemons
from .output import Output

#: The "testbed" of a local mrcd on a real host.
LOCAL: Final = ""


def local_socket(name: str | None = None) -> Path | None:
    """The local mrcd's socket when mrcctl should talk to it: $MRC_SOCKET, or (no testbed named and none
    up) the default socket when it exists. A $MRC_SOCKET too long for a unix socket is an error naming it."""
    env = os.environ.get("MRC_SOCKET")
    if env:
        return check_socket_path(env, "MRC_SOCKET")
    if name is None and not tbmod.names() and Path(DEFAULT_SOCKET).exists():
        return Path(DEFAULT_SOCKET)
    return None


def hosts(name: str | None, host: str | None) -> tuple[str, list[str]]:
    """The testbed meant and the hosts to ask: `host`, or every host whose mrcd socket exists or that
    `testbed up --with-daemons` started an mrcd for (so that one which died is asked, and reported, not
    left out); on a real host, the local mrcd's own host."""
    sock = local_socket(name)
    if sock is not None:
        with MrcClient(sock, timeout=10.0) as c:
            me = str(c.info["host"])
        if host is not None and host != me:
            raise MrcError(f"{sock}: this mrcd serves host {me}, not {host}")
        return LOCAL, [me]
    if name is None and not tbmod.names():
        raise MrcError(f"no testbed is up and no local mrcd ({DEFAULT_SOCKET} absent, $MRC_SOCKET unset): "
                       "start mrcd (mrcd --config FILE) or bring a testbed up (mrcctl testbed up)")
    tb = tbmod.Testbed.load(tbmod.resolve_name(name))
    names = tb.topo.host_names()
    if host is not None:
        if host not in names:
            raise MrcError(f"testbed {tb.name}: no host {host!r} (hosts: {', '.join(names)})")
        return tb.name, [host]
    started = daemons.records(tb.name).get("daemons", {})
    live = [h for h in names if h in started or socket_path(tb.ns(h)).exists()]
    if not live:
        raise MrcError(f"testbed {tb.name}: no mrcd is running (mrcctl testbed up --with-daemons)")
    return tb.name, live


@contextmanager
def client(name: str, host: str) -> Iterator[MrcClient]:
    sock = local_socket() if name == LOCAL else None
    if name == LOCAL and sock is None:
        raise MrcError("no local mrcd socket ($MRC_SOCKET or /run/mrc/mrcd.sock)")
    c = MrcClient(sock, timeout=10.0) if sock is not None else MrcClient.for_host(
        tbmod.Testbed.load(name).ns(host), timeout=10.0)
    try:
        yield c
    finally:
        c.close()


@dataclass
class Fleet:
    """What the selected hosts' mrcds answered, and why the others did not."""

    answers: dict[str, Any] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)  # host -> the error asking its mrcd

    def emit(self, out: Output, doc: dict[str, Any], render: Callable[[Any], str]) -> None:
        """`doc` (built from the answers) as the one document, with `unreachable` (host -> error) when
        some mrcd did not answer; then those hosts on stderr (text) and exit status 1: a fleet-wide read
        that is missing a host says so rather than looking complete."""
        if self.failed:
            doc = {**doc, "unreachable": dict(self.failed)}
        out.emit(doc, render)
        if self.failed:
            if not out.json:
                for h, why in self.failed.items():
                    out.err.write(f"mrcctl: error: {h}: {why}\n")
                out.err.flush()
            raise click.exceptions.Exit(1)


def ask_all(name: str | None, host: str | None, op: str, **args: Any) -> Fleet:
    """`op` on every selected host's mrcd. A host whose mrcd cannot be asked (stopped, killed, its socket
    left behind) is one entry of `failed`; the others are still asked."""
    tb, hs = hosts(name, host)
    res = Fleet()
    for h in hs:
        try:
            with client(tb, h) as c:
                res.answers[h] = c.call(op, **args)
        except MrcError as e:
            res.failed[h] = str(e)
    return res
