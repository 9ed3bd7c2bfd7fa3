"""mrcd's control socket against hostile clients (no root, no kernel): every line that is not a valid
request gets exactly one error reply and is counted by reason; nothing a client sends, however long,
deep or malformed, and no client that vanishes mid-line, ends the loop or loses the next answer; what a
client can make mrcd hold (descriptors, queued replies, QPs, regions) is bounded, and a region's memfd
must be sealed against shrinking: without the seal one client could kill mrcd for every other with
SIGBUS (register a region, truncate the memfd, post a send from it: reproduced on the testbed)."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from mrc.ctl.control_server import MAX_PENDING_FDS, MAX_REQUEST_BYTES, Client, ControlServer
from mrc.ctl.operations import Operations
from mrc.dataplane import shm


@pytest.fixture
def server(mrcd_ops: Operations) -> ControlServer:
    return ControlServer(selectors.DefaultSelector(), mrcd_ops)


def replies(c: Client) -> list[dict[str, Any]]:
    out = [json.loads(line) for line in bytes(c.wbuf).splitlines()]
    c.wbuf.clear()
    return out


BAD_LINES = [
    (b"[1]", "not_object"),
    (b'"x"', "not_object"),
    (b"5", "not_object"),
    (b"null", "not_object"),
    (b'{"qpn": Infinity, "op": "qp_stats"}', "bad_json"),
    (b'{"op": "qp_stats", "qpn": NaN}', "bad_json"),
    (b"[" * 60_000, "bad_json"),  # deeper than the parser recurses, shorter than the line limit
    (b"{" * 50_000, "bad_json"),
    (b"\xff\xfe not utf-8", "bad_json"),
    (b"{not json", "bad_json"),
    (b'{"op": 5}', "bad_op"),
    (b'{"id": 3}', "bad_op"),
    (b'{"op": "no_such_thing"}', "unknown_op"),
    (b'{"op": "__init__"}', "unknown_op"),
    (b'{"op": "qp_stats", "qpn": 1e400}', "bad_field"),
    (b'{"op": "qp_stats", "qpn": [1]}', "bad_field"),
    (b'{"op": "qp_stats"}', "bad_field"),
    (b'{"op": "qp_stats", "qpn": -1}', "bad_field"),
    (b'{"op": "qp_stats", "qpn": true}', "bad_field"),
    (b'{"op": "qp_stats", "qpn": 1, "qnp": 1}', "unknown_field"),
    (b'{"op": "qp_stats", "qpn": 77}', "invalid"),
    (b"x" * (MAX_REQUEST_BYTES + 1), "too_long"),
]


KIND = {"unknown_field": "unknown_field", "invalid": "refused"}
KIND.update({r: "bad_request" for r in ("not_object", "bad_json", "bad_op", "unknown_op", "bad_field",
                                        "too_long")})


@pytest.mark.parametrize(("line", "reason"), BAD_LINES, ids=[f"{r}{i}" for i, (_, r) in enumerate(BAD_LINES)])
def test_a_bad_line_gets_one_error_and_the_next_request_its_answer(
    server: ControlServer, line: bytes, reason: str
) -> None:
    a, b = socket.socketpair()
    with a, b:
        c = Client(a, 0)
        server.request(c, line)
        server.request(c, b'{"id": 9, "op": "qp_show"}')
        r = replies(c)
        assert len(r) == 2 and "error" in r[0] and r[1] == {"id": 9, "ok": []}
        assert r[0]["kind"] == KIND[reason]
        assert server.rejected == {reason: 1}


@pytest.mark.parametrize("exc", [ZeroDivisionError("integer division or modulo by zero"), KeyError("qpn")])
def test_a_handler_bug_is_internal_logged_and_the_loop_goes_on(
    make_ops: Any, capsys: pytest.CaptureFixture[str], exc: Exception
) -> None:
    """A handler that raises on a request the schema accepted is mrcd's bug, not the client's bad request
    (a KeyError used to be answered as `bad_field`)."""

    class Buggy(Operations):
        def op_qp_stats(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
            raise exc

    server = ControlServer(selectors.DefaultSelector(), make_ops(Buggy))
    a, b = socket.socketpair()
    with a, b:
        c = Client(a, 0)
        server.request(c, b'{"id": "x1", "op": "qp_stats", "qpn": 5}')
        server.request(c, b'{"id": [1, 2], "op": "qp_show"}')  # an id that is no id is not echoed
        assert replies(c) == [{"id": "x1", "error": "internal error in op qp_stats (mrcd logged it)",
                               "kind": "internal"}, {"id": None, "ok": []}]
    assert server.rejected == {"internal": 1}
    err = capsys.readouterr().err
    assert f"internal error in op qp_stats: {type(exc).__name__}: {exc}" in err


def test_an_oversized_line_is_refused_once_and_skipped_to_its_newline(server: ControlServer) -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    with a, b:
        c = Client(a, 0)
        b.setblocking(False)
        huge = b"y" * (4 * MAX_REQUEST_BYTES)
        sent = 0
        while sent < len(huge):  # the client keeps writing; mrcd keeps reading and discarding
            with contextlib.suppress(BlockingIOError):
                sent += b.send(huge[sent:])
            server.on_io(c, selectors.EVENT_READ)
        b.setblocking(True)
        b.sendall(b'\n{"id": 1, "op": "qp_show"}\n')
        for _ in range(10):
            server.on_io(c, selectors.EVENT_READ)
            if c.wbuf.count(b"\n") >= 2:
                break
        r = replies(c)
        assert len(r) == 2 and "longer than" in r[0]["error"] and r[1] == {"id": 1, "ok": []}
        assert server.rejected == {"too_long": 1} and len(c.rbuf) <= MAX_REQUEST_BYTES
        assert not c.skipping


def test_a_client_that_vanishes_mid_line_is_dropped_quietly(server: ControlServer) -> None:
    a, b = socket.socketpair()
    a.setblocking(False)
    c = Client(a, 0)
    server.clients[a.fileno()] = c
    b.sendall(b'{"id": 1, "op": "qp_')
    server.on_io(c, selectors.EVENT_READ)
    b.close()
    server.on_io(c, selectors.EVENT_READ)
    assert server.clients == {} and a.fileno() < 0 and server.rejected == {}


def _unsealed(size: int) -> int:
    fd = os.memfd_create("test-unsealed", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


# -- memory regions, descriptors, queued replies and QPs: what a client can make mrcd hold (a socketpair)


@pytest.fixture
def attached(mrcd_ops: Operations) -> Iterator[tuple[ControlServer, Client, socket.socket]]:
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
    attached: tuple[ControlServer, Client, socket.socket]
) -> None:
    srv, c, sk = attached
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
    attached: tuple[ControlServer, Client, socket.socket]
) -> None:
    srv, c, sk = attached
    gc.collect()  # earlier tests' unreachable sockets closed now, not while this one counts
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
    attached: tuple[ControlServer, Client, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mrc.ctl import control_server

    monkeypatch.setattr(control_server, "MAX_QUEUED_REPLY_BYTES", 4096)
    srv, c, sk = attached
    sk.setblocking(False)
    lines = b"".join(b'{"id":%d,"op":"qp_show"}\n' % i for i in range(2000))
    sent = sk.send(lines)
    for _ in range(200):  # loop turns without a flush: this client has not read a byte
        srv.begin_turn()
        srv.on_io(c, selectors.EVENT_READ)
        if c.paused:
            break
    assert c.paused and srv.paused_total == 1
    assert 4096 < len(c.wbuf) < 4096 + 64  # stopped at the first reply past the bound
    assert srv.sel.get_key(c.sock).events == selectors.EVENT_WRITE  # its requests are left unread
    assert c.rbuf.count(b"\n") > 0  # read before the pause, answered after it
    got = b""
    for _ in range(500):  # the client reads; mrcd answers the rest in order as the replies drain
        srv.begin_turn()  # each of mrcd's loop turns answers at most MAX_LINES_PER_TURN lines
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
    attached: tuple[ControlServer, Client, socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mrc.ctl import operations

    monkeypatch.setattr(operations, "MAX_QPS", 2)
    monkeypatch.setattr(operations, "MAX_MRS", 1)
    srv, c, sk = attached
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
