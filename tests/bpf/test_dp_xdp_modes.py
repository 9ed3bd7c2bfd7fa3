"""XDP attach modes (root): `Program.attach` puts host_ingress in the mode asked for (native in the driver,
generic in the stack; the kernel says which), refuses an interface that already has an XDP program rather
than replacing it, and detaching removes only what it attached. pyroute2's ``xdp_flags=`` keyword drops the
flags silently, which made every attach native-or-default and let a second attach replace the first."""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator

import pytest

from mrc.dataplane import bpf, netns
from mrc.errors import MrcError


@pytest.fixture
def veth(programs: dict[str, bpf.Program]) -> Iterator[str]:
    ns = "x" + secrets.token_hex(4)
    netns.create(ns)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "va", "type", "veth", "peer", "name", "vb"],
                       check=True)
        yield ns
    finally:
        netns.remove(ns)


def _xdp(ns: str, ifname: str) -> int | None:
    """The kernel's XDP attach mode of `ifname`: 1 native (driver), 2 generic (skb), None: nothing."""
    link = json.loads(subprocess.run(["ip", "-j", "-n", ns, "link", "show", ifname], capture_output=True,
                                     text=True, check=True).stdout)[0]
    mode = link.get("xdp", {}).get("mode")
    return None if mode is None else int(mode)


@pytest.mark.parametrize(("mode", "kernel"), [("native", 1), ("generic", 2)])
def test_attach_in_the_mode_asked_and_detach(programs: dict[str, bpf.Program], veth: str, mode: str,
                                            kernel: int) -> None:
    prog = programs["host_ingress"]
    att = prog.attach(veth, "va", xdp_mode=mode, testbed="xdpmodes", node="n")
    try:
        assert att["xdp_mode"] == mode
        assert _xdp(veth, "va") == kernel
        assert _xdp(veth, "vb") is None
    finally:
        prog.detach(att)
    assert _xdp(veth, "va") is None


def test_an_interface_with_xdp_already_is_refused_not_replaced(programs: dict[str, bpf.Program],
                                                               veth: str) -> None:
    prog = programs["host_ingress"]
    att = prog.attach(veth, "va", xdp_mode="native", testbed="xdpmodes", node="n")
    try:
        before = prog.record["attachments"][:]
        with pytest.raises(MrcError, match="already has an XDP program"):
            prog.attach(veth, "va", xdp_mode="native", testbed="xdpmodes", node="n")
        assert prog.record["attachments"] == before  # the refused attempt left no record
        assert _xdp(veth, "va") == 1  # and the first program is still there
    finally:
        prog.detach(att)
    assert _xdp(veth, "va") is None


def test_an_unknown_mode_is_refused(programs: dict[str, bpf.Program], veth: str) -> None:
    with pytest.raises(MrcError, match="XDP mode must be one of native, generic"):
        programs["host_ingress"].attach(veth, "va", xdp_mode="offload", testbed="xdpmodes", node="n")
