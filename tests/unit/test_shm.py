"""Shared memory handed between processes (`mrc.dataplane.shm`) and mrcd's side of it: a region's memfd
must be sealed against shrinking, because a process touching a mapped page past the file's end dies of
SIGBUS. Without the seal one client could kill mrcd for every other: register a region, truncate the
memfd, post a send from it (reproduced on the testbed before this change). No root, no kernel set-up:
mrcd's control server runs on a socketpair in this process."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import selectors
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mrc.ctl.control_server import MAX_PENDING_FDS, Client, ControlServer
from mrc.ctl.operations import Operations
from mrc.dataplane import shm
from mrc.errors import MrcError


def _unsealed(size: int) -> int:
    fd = os.memfd_create("test-unsealed", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


def test_a_created_region_cannot_shrink_but_can_grow_and_maps_in_the_receiver() -> None:
    fd, buf = shm.create("test", 8192)
    try:
        assert fcntl.fcntl(fd, fcntl.F_GET_SEALS) & shm.SEALS == shm.SEALS
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 4096)  # the kernel refuses: a mapping can never lose its pages
        with pytest.raises(PermissionError):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE)  # F_SEAL_SEAL: seals are final
        os.ftruncate(fd, 3 * 4096)  # growing is harmless
        buf[:5] = b"hello"
        peer = shm.map_received(fd, 8192, "test")
        assert peer[:5] == b"hello"
        peer[8191] = 7
        assert buf[8191] == 7
        peer.close()
    finally:
        buf.close()
        os.close(fd)


@pytest.mark.parametrize("case, words", [
    ("unsealed", "not sealed against shrinking"),
    ("file", "not a sealable memfd"),
    ("pipe", "not a sealable memfd"),
    ("short", "is more than the memfd's 4096 bytes"),
    ("zero", "must be positive"),
    ("write_sealed", "cannot map the memfd shared and writable"),
])
def test_map_received_refuses_what_its_sender_could_pull_away_and_says_why(
    case: str, words: str, tmp_path: Path
) -> None:
    closers: list[int] = []
    length = 4096
    if case == "unsealed":
        fd = _unsealed(4096)
    elif case == "file":
        f = tmp_path / "region"
        f.write_bytes(bytes(4096))
        fd = os.open(f, os.O_RDWR)
    elif case == "pipe":
        fd, w = os.pipe()
        closers.append(w)
    elif case == "write_sealed":
        fd = os.memfd_create("test-ro", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, 4096)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_WRITE)
    else:
        fd, buf = shm.create("test", 4096)
        buf.close()
        length = 8192 if case == "short" else 0
    closers.append(fd)
    try:
        with pytest.raises(MrcError, match="^reg_mr: .*" + words):
            shm.map_received(fd, length, "reg_mr")
    finally:
        for x in closers:
            os.close(x)


# -- mrcd's control server, over a socketpair


@pytest.fixture
def server(mrcd_ops: Operations) -> Iterator[tuple[ControlServer, Client, socket.socket]]:
    """mrcd's control server with one attached client: (server, mrcd's Client, the client's socket)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    theirs.setblocking(False)
    srv = ControlServer(selectors.DefaultSelector(), mrcd_ops)
    c = srv.attach(theirs, os.getuid())
    srv.flush()
    mine.settimeout(5)
    assert json.loads(mine.recv(1 << 16))["id"] == 0  # the greeting
    yield srv, c, mine
    srv.drop(c)
    mine.close()


def _ask(srv: ControlServer, c: Client, sk: socket.socket, req: dict[str, Any], fds: list[int]) -> Any:
    data = (json.dumps(req) + "\n").encode()
    socket.send_fds(sk, [data], fds) if fds else sk.sendall(data)
    srv.on_io(c, selectors.EVENT_READ)
    srv.flush()
    return json.loads(sk.recv(1 << 16))


def test_mrcd_registers_a_sealed_region_and_refuses_an_unsealed_one(
    server: tuple[ControlServer, Client, socket.socket]
) -> None:
    srv, c, sk = server
    fd, buf = shm.create("test", 4096)
    ok = _ask(srv, c, sk, {"id": 1, "op": "reg_mr", "length": 4096}, [fd])
    assert ok["ok"]["length"] == 4096
    with pytest.raises(PermissionError):
        os.ftruncate(fd, 0)  # the client can no longer pull the pages from under mrcd's mapping
    os.close(fd)
    bad = _unsealed(4096)
    no = _ask(srv, c, sk, {"id": 2, "op": "reg_mr", "length": 4096}, [bad])
    os.close(bad)
    assert no["id"] == 2 and no["kind"] == "refused"
    assert "not sealed against shrinking" in no["error"] and "F_SEAL_SHRINK" in no["error"]
    assert srv.rejected == {"invalid": 1}
    assert len(c.mrs) == 1  # only the sealed one; mrcd's loop and the connection go on
    assert _ask(srv, c, sk, {"id": 3, "op": "qp_show"}, [])["ok"] == []
    buf.close()


def test_descriptors_no_request_takes_are_bounded_closed_and_counted(
    server: tuple[ControlServer, Client, socket.socket]
) -> None:
    srv, c, sk = server
    before = len(os.listdir("/proc/self/fd"))
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(3 * MAX_PENDING_FDS)]
    try:
        for i in range(3):  # one message carries at most 16 descriptors into mrcd's recvmsg
            batch = spare[i * MAX_PENDING_FDS:(i + 1) * MAX_PENDING_FDS]
            assert _ask(srv, c, sk, {"id": 10 + i, "op": "qp_show"}, batch)["ok"] == []
    finally:
        for fd in spare:
            os.close(fd)
    assert len(c.fds) == MAX_PENDING_FDS
    assert srv.rejected == {"too_many_fds": 2 * MAX_PENDING_FDS}
    # what mrcd kept is its MAX_PENDING_FDS; every other copy it received was closed at once
    assert len(os.listdir("/proc/self/fd")) == before + MAX_PENDING_FDS


def test_a_client_that_never_reads_its_replies_stops_being_read_not_buffered_without_bound(
    server: tuple[ControlServer, Client, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mrc.ctl import control_server

    monkeypatch.setattr(control_server, "MAX_QUEUED_REPLY_BYTES", 4096)
    srv, c, sk = server
    sk.setblocking(False)
    lines = b"".join(b'{"id":%d,"op":"qp_show"}\n' % i for i in range(2000))
    sent = sk.send(lines)
    srv.on_io(c, selectors.EVENT_READ)  # no flush: this client has not read a byte
    assert c.paused and srv.paused_total == 1
    assert 4096 < len(c.wbuf) < 4096 + 64  # stopped at the first reply past the bound
    assert srv.sel.get_key(c.sock).events == selectors.EVENT_WRITE  # its requests are left unread
    assert c.rbuf.count(b"\n") > 0  # read before the pause, answered after it
    got = b""
    for _ in range(500):  # the client reads; mrcd answers the rest in order as the replies drain
        srv.on_io(c, selectors.EVENT_WRITE if c.paused else selectors.EVENT_READ)
        srv.flush()
        with contextlib.suppress(BlockingIOError):
            got += sk.recv(1 << 20)
        if sent < len(lines):
            with contextlib.suppress(BlockingIOError):
                sent += sk.send(lines[sent:])
        if got.count(b"\n") == 2000:
            break
    ids = [json.loads(x)["id"] for x in got.splitlines()]
    assert ids == list(range(2000))
    assert not c.paused and srv.sel.get_key(c.sock).events == selectors.EVENT_READ


def test_mrcd_refuses_more_qps_and_regions_than_it_holds(
    server: tuple[ControlServer, Client, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mrc.ctl import operations

    monkeypatch.setattr(operations, "MAX_QPS", 2)
    monkeypatch.setattr(operations, "MAX_MRS", 1)
    srv, c, sk = server
    for i in range(2):
        assert "qpn" in _ask(srv, c, sk, {"id": i, "op": "create_qp", "peer": "h2"}, [])["ok"]
    no = _ask(srv, c, sk, {"id": 5, "op": "create_qp", "peer": "h2"}, [])
    assert no["kind"] == "refused" and "holds 2 QPs, the most it takes" in no["error"]
    fd, buf = shm.create("test", 4096)
    fd2, buf2 = shm.create("test", 4096)
    assert "rkey" in _ask(srv, c, sk, {"id": 6, "op": "reg_mr", "length": 4096}, [fd])["ok"]
    no = _ask(srv, c, sk, {"id": 7, "op": "reg_mr", "length": 4096}, [fd2])
    assert no["kind"] == "refused" and "holds 1 memory regions" in no["error"]
    assert not c.fds  # the refused region's descriptor was taken and closed, not left pending
    for f, b in ((fd, buf), (fd2, buf2)):
        os.close(f)
        b.close()
    assert len(c.qps) == 2 and len(c.mrs) == 1
