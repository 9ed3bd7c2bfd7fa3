"""mrcd's control socket against hostile clients (no root, no kernel): every line that is not a valid
request gets exactly one error reply and is counted by reason; nothing a client sends, however long,
deep or malformed, and no client that vanishes mid-line, ends the loop or loses the next answer."""

from __future__ import annotations

import contextlib
import json
import selectors
import socket
from typing import Any

import pytest

from mrc.ctl.control_server import MAX_REQUEST_BYTES, Client, ControlServer
from mrc.ctl.operations import Operations


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
