"""Hostile input to the control plane an outside audit found (each case failed before its fix): an
`actions` request with a null `since_ns` was an internal error; `link_status` reports with long or
distinct `from` strings grew mrcd without bound and made the `actions` answer longer than the client
reads; the client waited out its whole timeout for an answer mrcd had refused with id null, and raised
JSON / attribute tracebacks for a reply that is not one; a %scope on a fabric prefix passed the config
loaders and failed only at setup."""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_config_defects import TOPO, _hc_error, _topo_error
from test_hostconfig import CLOS

from mrc.ctl import controller as ctlmod
from mrc.ctl import operations as opsmod
from mrc.ctl.control_server import Client, ControlServer, push
from mrc.ctl.operations import Operations
from mrc.dataplane import client as clientmod
from mrc.dataplane.client import MrcClient
from mrc.dataplane.protocol import MAX_REPORTER_LEN, MAX_REQUEST_BYTES, ErrorKind, ProtocolError

# -- helpers


def _answers(server: ControlServer, *lines: bytes) -> list[dict[str, Any]]:
    a, b = socket.socketpair()
    with a, b:
        c = Client(a, 0)
        for line in lines:
            server.request(c, line)
        return [json.loads(x) for x in bytes(c.wbuf).splitlines()]


def _link(ops: Operations) -> list[str]:
    """A fabric link h0's paths cross (a core link: reports of it are kept per reporter)."""
    ctl = ops.e.controller
    core = sorted(sorted(lk) for lk in ctl.fabric_links() if ctl.access_plane(lk) is None)
    return core[0]


def _report(link: list[str], state: str, sender: Any) -> bytes:
    return json.dumps({"id": 1, "op": "link_status", "link": link, "state": state, "from": sender}).encode()


@pytest.fixture
def server(mrcd_ops: Operations) -> ControlServer:
    return ControlServer(selectors.DefaultSelector(), mrcd_ops)


# -- 1: optional fields sent as null, ill-typed fields


def test_actions_with_a_null_since_ns_answers_everything_not_an_internal_error(server: ControlServer) -> None:
    """A null optional field means its default (the schema's rule): `int(None)` made it `internal`."""
    (r,) = _answers(server, b'{"id": 1, "op": "actions", "since_ns": null}')
    assert "ok" in r and r["ok"]["actions"] == [] and r["ok"]["omitted"] == {"actions": 0, "events": 0}
    assert server.rejected == {}


@pytest.mark.parametrize("value", ['"5"', "1.5", "true", "9" * 30, "-1", "[1]"])
def test_actions_with_an_ill_typed_since_ns_is_a_bad_request_naming_the_field(
    server: ControlServer, value: str
) -> None:
    (r,) = _answers(server, b'{"id": 1, "op": "actions", "since_ns": ' + value.encode() + b"}")
    assert r["kind"] == "bad_request" and "'since_ns'" in r["error"] and "an integer" in r["error"]
    assert server.rejected == {"bad_field": 1}


def test_the_handlers_check_an_optional_field_themselves(mrcd_ops: Operations) -> None:
    """Called without the control server's schema check (a caller in-process), a handler still refuses
    an ill-typed optional field as a bad request naming it, rather than with int()'s TypeError."""
    with pytest.raises(ProtocolError, match="'since_ns'") as e:
        mrcd_ops.op_actions(None, {"op": "actions", "since_ns": "x"})  # type: ignore[arg-type]
    assert e.value.kind is ErrorKind.BAD_REQUEST
    with pytest.raises(ProtocolError, match="'from'"):
        mrcd_ops.op_link_status(None, {"op": "link_status", "link": ["a", "b"], "state": "up",  # type: ignore[arg-type]
                                       "from": 5})


def test_a_null_from_is_the_unknown_reporter_not_the_string_none(mrcd_ops: Operations,
                                                                 server: ControlServer) -> None:
    link = _link(mrcd_ops)
    (r,) = _answers(server, _report(link, "down", None))
    assert r["ok"]["result"] == "denied"
    assert mrcd_ops.e.controller.remote[frozenset(link)] == {"?"}


# -- 2: link_status reporters bounded, and the actions answer


def test_a_reporter_longer_than_a_host_name_is_refused(mrcd_ops: Operations, server: ControlServer) -> None:
    link = _link(mrcd_ops)
    ok, bad = _answers(server, _report(link, "down", "h" * MAX_REPORTER_LEN),
                       _report(link, "down", "h" * (MAX_REPORTER_LEN + 1)))
    assert ok["ok"]["result"] == "denied"
    assert bad["kind"] == "bad_request" and "'from'" in bad["error"]
    assert f"at most {MAX_REPORTER_LEN} characters" in bad["error"] and "65 characters" in bad["error"]
    assert mrcd_ops.e.controller.remote[frozenset(link)] == {"h" * MAX_REPORTER_LEN}


def test_the_reporters_of_a_link_are_bounded_and_the_rest_counted(mrcd_ops: Operations,
                                                                  server: ControlServer) -> None:
    link = _link(mrcd_ops)
    n = 3 * ctlmod.MAX_REPORTERS_PER_LINK
    rs = _answers(server, *(_report(link, "down", f"r{i}") for i in range(n)))
    assert [r["ok"]["result"] for r in rs] == ["denied"] + ["known"] * (n - 1)
    ctl = mrcd_ops.e.controller
    assert len(ctl.remote[frozenset(link)]) == ctlmod.MAX_REPORTERS_PER_LINK
    assert ctl.reporters_refused == n - ctlmod.MAX_REPORTERS_PER_LINK
    # a reporter already kept, again: neither added nor refused
    _answers(server, _report(link, "down", "r0"))
    assert ctl.reporters_refused == n - ctlmod.MAX_REPORTERS_PER_LINK
    (st,) = _answers(server, b'{"id": 3, "op": "stats"}')
    assert st["ok"]["reporters_refused"] == n - ctlmod.MAX_REPORTERS_PER_LINK


def test_a_long_action_detail_is_cut(mrcd_ops: Operations) -> None:
    ctl = mrcd_ops.e.controller
    ctl.act(ctlmod.Action(1, "deny", "a-b", 0, "x" * 10_000))
    a = ctl.log[-1]
    assert len(a.detail) == ctlmod.MAX_DETAIL and a.detail.endswith("...")


def test_the_actions_answer_fits_the_clients_line_whatever_the_log_holds(
    mrcd_ops: Operations, server: ControlServer
) -> None:
    """The log holds MAX_LOG actions and as many events; answered whole, that passed the client's
    MAX_LINE. The answer keeps the newest that fit and counts the older ones left out."""
    ctl = mrcd_ops.e.controller
    for i in range(ctlmod.MAX_LOG):
        ctl.log.append(ctlmod.Action(i, "deny", "p0l0-p0s0", 3, "d" * ctlmod.MAX_DETAIL))
        ctl.events.append({"time_ns": i, "qpn": 256, "peer": "h2", "ev_index": 7, "state": "ASSUMED_BAD",
                           "why": "w" * 100})
    a, b = socket.socketpair()
    with a, b:
        c = Client(a, 0)
        t0 = time.monotonic()
        server.request(c, b'{"id": 1, "op": "actions"}')
        took = time.monotonic() - t0
        line = bytes(c.wbuf)
    assert len(line) <= opsmod.MAX_ACTIONS_REPLY_BYTES + 1024 < clientmod.MAX_LINE - (1 << 20)
    r = json.loads(line)["ok"]
    acts, evs = r["actions"], r["events"]
    newest = ctlmod.MAX_LOG - 1
    assert acts and evs and acts[-1]["time_ns"] == newest and evs[-1]["time_ns"] == newest
    assert [x["time_ns"] for x in acts] == sorted(x["time_ns"] for x in acts)  # oldest first, as before
    assert r["omitted"] == {"actions": ctlmod.MAX_LOG - len(acts), "events": ctlmod.MAX_LOG - len(evs)}
    assert took < 20  # bounded by the reply's size, not by the log's length
    # since_ns still selects: the newest few, nothing omitted
    (r2,) = _answers(server, json.dumps({"id": 2, "op": "actions", "since_ns": ctlmod.MAX_LOG - 5}).encode())
    assert len(r2["ok"]["actions"]) == 5 and r2["ok"]["omitted"] == {"actions": 0, "events": 0}


# -- 3, 4: the client against id-less refusals and lines that are no reply


def _serve(ops: Operations, path: Path, script: list[bytes] | None = None) -> Iterator[None]:
    """mrcd's control server for one connection (greeting, then every line through
    `ControlServer.request`), or, with `script`, a fake mrcd that answers each request line with the
    next of `script` after the greeting."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    server = ControlServer(selectors.DefaultSelector(), ops)

    def one(conn: socket.socket) -> None:
        with conn:
            c = Client(conn, 0)
            push(c, {"id": 0, "ok": ops.greeting()})
            buf = b""
            answers = list(script or [])
            while True:
                conn.sendall(bytes(c.wbuf))
                c.wbuf.clear()
                try:
                    data = conn.recv(1 << 16)
                except OSError:
                    return
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if script is None or b'"op":"hello"' in line:
                        server.request(c, line)
                    elif answers:
                        c.wbuf += answers.pop(0)

    def serve() -> None:  # one connection after the other, until the socket is closed
        while True:
            try:
                conn, _ = srv.accept()
            except OSError:
                return
            one(conn)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield
    srv.shutdown(socket.SHUT_RDWR)
    srv.close()
    t.join(5)


class _Garbling(MrcClient):
    """A client whose next request goes out as a line mrcd cannot read (as a buggy or older client's
    would): mrcd answers it with id null."""

    garble: bytes | None = None

    def __enter__(self) -> _Garbling:
        return self

    def _send(self, doc: dict[str, Any], fds: list[int] | None = None) -> None:
        if self.garble is not None:
            self.sk.sendall(self.garble)
            self.garble = None
            return
        super()._send(doc, fds)


@pytest.mark.parametrize(("line", "match"), [(b"{not json\n", "not JSON"),
                                             (b"x" * (MAX_REQUEST_BYTES + 10) + b"\n", "longer than")])
def test_an_id_less_refusal_fails_the_call_at_once(mrcd_ops: Operations, tmp_path: Path, line: bytes,
                                                   match: str) -> None:
    path = tmp_path / "h0.sock"
    gen = _serve(mrcd_ops, path)
    next(gen)
    with _Garbling(path, timeout=30.0) as c:
        c.garble = line
        t0 = time.monotonic()
        with pytest.raises(ProtocolError, match=match) as e:
            c.call("qp_show")
        assert time.monotonic() - t0 < 5  # mrcd's refusal, not the 30 s timeout
        assert e.value.kind is ErrorKind.BAD_REQUEST
        if b"{" in line:  # (an over-long line's tail is skipped by mrcd until its newline: nothing left)
            assert c.call("qp_show") == []  # the connection goes on
    next(gen, None)


def test_an_id_less_refusal_goes_to_the_oldest_request_sent_without_waiting(
    mrcd_ops: Operations, tmp_path: Path
) -> None:
    path = tmp_path / "h0.sock"
    gen = _serve(mrcd_ops, path)
    next(gen)
    with _Garbling(path, timeout=30.0) as c:
        c.garble = b"{not json\n"
        c.call_nowait("qp_show")  # goes out garbled
        t0 = time.monotonic()
        with pytest.raises(ProtocolError, match=r"qp_show \(request \d+, sent without waiting\).*not JSON"):
            c.sync()
        assert time.monotonic() - t0 < 5
        c.call_nowait("port_show")
        c.garble = b"{not json\n"
        with pytest.raises(ProtocolError, match="not JSON"):
            c.call("qp_show")  # port_show's answer first, then the refusal of this one
        assert c.call("qp_show") == []
    next(gen, None)


def test_a_request_longer_than_mrcd_reads_is_refused_before_sending(served_path: Path) -> None:
    with MrcClient(served_path, timeout=30.0) as c:
        t0 = time.monotonic()
        with pytest.raises(ProtocolError, match=rf"longer than the {MAX_REQUEST_BYTES} bytes") as e:
            c.call("ev_show", state="x" * MAX_REQUEST_BYTES)
        assert time.monotonic() - t0 < 5 and e.value.kind is ErrorKind.BAD_REQUEST
        assert c._id == 1  # only hello went out
        assert c.call("qp_show") == []


@pytest.fixture
def served_path(mrcd_ops: Operations, tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "h0.sock"
    gen = _serve(mrcd_ops, path)
    next(gen)
    yield path
    next(gen, None)


@pytest.mark.parametrize(("reply", "match"), [
    (b"this is not json\n", "not JSON"),
    (b"\xff\xfe\n", "not JSON"),
    (b"[1, 2]\n", "JSON list, not an object"),
    (b"null\n", "JSON NoneType, not an object"),
    (b'{"id": [1], "ok": null}\n', "its id is list"),
    (b'{"id": 2}\n', "without ok, error or push"),
    (b'{"push": "wc", "qpn": "x"}\n', "work completion whose qpn is str"),
])
def test_a_reply_that_is_not_one_is_the_clients_protocol_error(
    mrcd_ops: Operations, tmp_path: Path, reply: bytes, match: str
) -> None:
    path = tmp_path / "h0.sock"
    gen = _serve(mrcd_ops, path, script=[reply])
    next(gen)
    with MrcClient(path, timeout=30.0) as c, pytest.raises(ProtocolError, match=match) as e:
        c.call("qp_show")
    assert e.value.kind is ErrorKind.INTERNAL and "mrcd sent a line that is not a reply" in str(e.value)
    next(gen, None)


def test_mrcctl_prints_a_bad_reply_as_an_error_without_a_traceback(
    mrcd_ops: Operations, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from mrc.ctl import cli

    gen = _serve(mrcd_ops, tmp_path / "h0.sock", script=[b"[1]\n"])
    next(gen)
    monkeypatch.setenv("MRC_SOCKET", str(tmp_path / "h0.sock"))
    rc = _run_cli(cli, ["qp", "show"])
    out = capsys.readouterr()
    assert rc != 0 and "Traceback" not in out.err + out.out
    assert "not a reply: JSON list, not an object" in out.err
    next(gen, None)


def _run_cli(cli: Any, argv: list[str]) -> int:
    try:
        rc = cli.main(argv)
    except SystemExit as e:
        return int(e.code or 0) if not isinstance(e.code, str) else 1
    return int(rc or 0)


# -- 5: a %scope on a fabric prefix


@pytest.mark.parametrize(("old", "new", "key", "line"), [
    ('mrc_prefix = "fd00::/48"', 'mrc_prefix = "fd00::%eth0/48"', "host.mrc_prefix", 4),
    ('shape = "clos"', 'shape = "clos"\nusid_block = "fcbb:bbbb::%lo/32"', "fabric.usid_block", 18),
])
def test_a_host_config_prefix_with_a_scope_is_refused_at_parse_time(tmp_path: Path, old: str, new: str,
                                                                     key: str, line: int) -> None:
    assert old in CLOS
    msg = _hc_error(tmp_path, CLOS.replace(old, new))
    assert msg.startswith(f"{tmp_path / 'mrcd.toml'}:{line}: {key}: ") and "takes no %scope" in msg


@pytest.mark.parametrize("key", ["usid_block", "link_prefix", "mrc_prefix"])
def test_a_topology_prefix_with_a_scope_is_refused_at_parse_time(tmp_path: Path, key: str) -> None:
    msg = _topo_error(tmp_path, TOPO + f'\n[addressing]\n{key} = "fc00::%lo"\n')
    assert msg.startswith(f"{tmp_path / 't.toml'}:14: addressing.{key}: ") and "takes no %scope" in msg

