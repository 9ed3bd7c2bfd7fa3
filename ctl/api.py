"""mrcctl's side of the control socket: find the testbed's mrcds and ask them (docs/daemon.md)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from mrc.dataplane import testbed as tbmod
from mrc.dataplane.client import MrcClient, socket_path
from mrc.errors import MrcError


def hosts(name: str | None, host: str | None) -> tuple[str, list[str]]:
    """The testbed meant and the hosts to ask: `host`, or every host whose mrcd socket exists."""
    tb = tbmod.Testbed.load(tbmod.resolve_name(name))
    names = tb.topo.host_names()
    if host is not None:
        if host not in names:
            raise MrcError(f"testbed {tb.name}: no host {host!r} (hosts: {', '.join(names)})")
        return tb.name, [host]
    live = [h for h in names if socket_path(tb.ns(h)).exists()]
    if not live:
        raise MrcError(f"testbed {tb.name}: no mrcd is running (mrcctl testbed up --with-daemons)")
    return tb.name, live


@contextmanager
def client(name: str, host: str) -> Iterator[MrcClient]:
    c = MrcClient.for_host(tbmod.Testbed.load(name).ns(host), timeout=10.0)
    try:
        yield c
    finally:
        c.close()


def ask_all(name: str | None, host: str | None, op: str, **args: Any) -> dict[str, Any]:
    """`op` on every selected host's mrcd: {host: answer}."""
    tb, hs = hosts(name, host)
    out = {}
    for h in hs:
        with client(tb, h) as c:
            out[h] = c.call(op, **args)
    return out
