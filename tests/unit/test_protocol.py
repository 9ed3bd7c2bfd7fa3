"""The shared mrcd protocol (`mrc.dataplane.protocol`): the client and mrcd check the same schema, the
schema accepts every request the client and mrcctl send today, and an error reply says whose fault it
is (bad_request, unknown_field, refused, internal). No root, no kernel: mrcd's request path runs on a
stub daemon behind a real AF_UNIX socket."""

from __future__ import annotations

import inspect
import json
import os
import re
import selectors
import socket
import threading
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mrc.ctl.control_server import Client, ControlServer, push
from mrc.ctl.operations import Operations
from mrc.ctl.peer_notes import PeerNotifier, link_status_line
from mrc.dataplane.client import MAX_UNANSWERED, ClientQp, MrcClient
from mrc.dataplane.protocol import (
    OPS,
    PROTOCOL_VERSION,
    ErrorKind,
    ProtocolError,
    check_response,
    validate_request,
)
from mrc.errors import MrcError

GA = bytes.fromhex("fd000000000000000000000000000001")

#: A well-formed answer to each op, shaped as its schema says, for the recording client.
ANSWERS: dict[str, Any] = {
    "hello": {"host": "h0", "testbed": "t", "gid": "fd00::1", "planes": 2, "evs": 4, "pid": 1, "version": "x",
              "peers": ["h2"], "link_rate_bps": 1, "protocol": PROTOCOL_VERSION},
    "reg_mr": {"handle": 1, "rkey": 2, "addr": 4096, "length": 4096},
    "create_qp": {"qpn": 256, "peer_gid": "fd00::3"},
    "qp_stats": {"qpn": 256, "peer": "h2", "time_ns": 1},
    "qp_show": [], "port_show": [],
    "ev_show": {"host": "h0", "peers": {}, "denied_links": []},
    "ev_deny": {"host": "h0", "peer": "h2", "denied": []},
    "ev_restore": {"host": "h0", "peer": "h2", "restored": []},
    "port_set": {"host": "h0", "port": 1, "enabled": False},
    "actions": {"actions": [], "events": []},
    "stats": {"host": "h0", "engine_drops": {}, "driver": {}, "qps": 0, "controller": {}, "denied_links": []},
}


class Recorder(MrcClient):
    """An MrcClient whose wire is a list: what it would send is kept, the answer comes from ANSWERS."""

    def __init__(self) -> None:  # no socket, no greeting
        self.path = Path("recorder")
        self.timeout = 1.0
        self._id = 0
        self._rbuf = bytearray()
        self.pushes = deque()
        self._wcs = {}
        self._unanswered = {}
        self._deferred = None
        self.mrs = []
        self.sent: list[dict[str, Any]] = []

    def _send(self, doc: dict[str, Any], fds: list[int] | None = None) -> None:
        self.sent.append(doc)

    def _read_line(self, timeout: float | None) -> dict[str, Any] | None:
        doc = self.sent[-1]
        return {"id": doc["id"], "ok": ANSWERS.get(doc["op"])}


def _client_requests() -> list[dict[str, Any]]:
    """Every request the client library and mrcctl send today, produced by their own code paths."""
    from mrc.dataplane.client import ClientQp

    c = Recorder()
    mr = c.reg_mr(4096)
    qp = c.create_qp("h2")
    c.create_qp("h2", evs=1, planes=[0], cc="null")
    c.connect(qp, 300)
    c.connect(qp, 300, 4096)  # protocol 1.1: the peer QP's payload
    c.post_send(qp, wr_id=1, mr=mr, offset=0, length=4096, remote_addr=8192, rkey=7)
    c.post_send(qp, wr_id=2, mr=mr, offset=0, length=0, remote_addr=8192, rkey=7, imm=9)
    c.post_recv(qp, 3)
    c.destroy_qp(ClientQp(256, "h2", "fd00::3"))
    # mrcctl / bench / all-reduce (ctl/cmd_*.py, ctl/bench.py, ctl/allreduce_mrc.py), as they call
    c.call("qp_stats", qpn=qp.qpn)
    c.call("actions", since_ns=12345)
    for state in (None, "denied"):
        c.call("ev_show", state=state)
    c.call("ev_deny", peer="h2", evs=[1, 2], plane=None, link=None)
    c.call("ev_restore", peer="h2", evs=[], plane=0, link="p0l0-p0s0")
    c.call("port_set", port=1, enabled=False)
    for op in ("qp_show", "port_show", "stats"):
        c.call(op)
    c.call("hello", protocol=PROTOCOL_VERSION)  # as MrcClient.__init__ sends it
    mr.close()
    return c.sent


def _peer_report(tmp_path: Path) -> dict[str, Any]:
    """The `link_status` line one mrcd sends another (Daemon.tell_peers), caught on a listening socket."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(tmp_path / "ns-h1.sock"))
    srv.listen(1)
    sel = selectors.DefaultSelector()
    notifier = PeerNotifier(sel)
    line = link_status_line(frozenset(("p0l0", "p0s0")), "down", "h0")
    notifier.send(str(tmp_path / "ns-h1.sock"), line, 0)
    notifier.pump(0)  # queued; mrcd's loop sends it:
    for key, _mask in sel.select(1.0):
        notifier.on_writable(key.data, 0)
    sel.close()
    conn, _ = srv.accept()
    with conn, srv:
        doc: dict[str, Any] = json.loads(conn.recv(4096))
    return doc


def test_the_schema_accepts_every_request_sent_today(tmp_path: Path) -> None:
    sent = [*_client_requests(), _peer_report(tmp_path)]
    for doc in sent:
        assert validate_request(doc) is OPS[doc["op"]], doc
    assert {d["op"] for d in sent} == set(OPS)  # every op is exercised by some sender


def test_every_daemon_op_has_a_schema_and_every_schema_an_op() -> None:
    handlers = {n.removeprefix("op_") for n, _ in inspect.getmembers(Operations, inspect.isfunction)
                if n.startswith("op_")}
    assert handlers == set(OPS)


def test_a_misspelt_field_fails_in_the_client_naming_it_and_nothing_is_sent() -> None:
    c = Recorder()
    with pytest.raises(ProtocolError, match=r"qp_stats: unknown field 'qnp' \(it takes: qpn\)") as e:
        c.call("qp_stats", qnp=5)
    assert e.value.kind is ErrorKind.UNKNOWN_FIELD and c.sent == []


@pytest.mark.parametrize(("args", "words"), [
    ({"qpn": "5"}, "field 'qpn' must be an integer in 0..4294967295, got str '5'"),
    ({"qpn": 5.0}, "field 'qpn' must be an integer"),
    ({"qpn": True}, "field 'qpn' must be an integer"),
    ({"qpn": 1 << 32}, "field 'qpn' must be an integer in 0..4294967295"),
    ({}, "missing field 'qpn'"),
])
def test_an_ill_typed_field_is_a_bad_request_naming_field_and_type(args: dict[str, Any], words: str) -> None:
    with pytest.raises(ProtocolError) as e:
        Recorder().call("qp_stats", **args)
    assert e.value.kind is ErrorKind.BAD_REQUEST and words in str(e.value)


def test_choices_lists_and_bools_are_checked() -> None:
    bad: list[dict[str, Any]] = [
        {"op": "create_qp", "peer": "h2", "cc": "cubic"},
        {"op": "create_qp", "peer": "h2", "planes": [0, "1"]},
        {"op": "port_set", "port": 0, "enabled": 1},
        {"op": "link_status", "link": ["a"], "state": "down"},
        {"op": "link_status", "link": ["a", "b"], "state": "sideways"},
        {"op": "no_such_op"},
        {"op": "connect", "qpn": 256, "peer_qpn": 257, "mtu": 64},  # a payload mrcd's QPs never take
        {"op": "connect", "qpn": 256, "peer_qpn": 257, "mtu": 16384},
    ]
    for req in bad:
        with pytest.raises(ProtocolError) as e:
            validate_request(req)
        assert e.value.kind is ErrorKind.BAD_REQUEST, req


def test_a_response_of_the_wrong_shape_is_an_error() -> None:
    check_response("qp_show", [])
    check_response("connect", None)
    for op, value in [("create_qp", {"qpn": 1}), ("qp_show", {}), ("connect", 1), ("port_show", [1])]:
        with pytest.raises(MrcError, match=op):
            check_response(op, value)


# -- the client against mrcd's real request path (Daemon._request) on a stub daemon


def _serve(ops: Operations, tmp_path: Path) -> Iterator[tuple[Path, ControlServer]]:
    """mrcd's control server for one connection on a real AF_UNIX socket: greeting, then every line
    through `ControlServer.request`."""
    path = tmp_path / "h0.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)
    server = ControlServer(selectors.DefaultSelector(), ops)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            c = Client(conn, 0)
            push(c, {"id": 0, "ok": ops.greeting()})
            buf = b""
            while True:
                conn.sendall(bytes(c.wbuf))
                c.wbuf.clear()
                data = conn.recv(1 << 16)
                if not data:
                    return
                buf += data
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    server.request(c, line)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield path, server
    srv.close()
    t.join(5)


@pytest.fixture
def served(mrcd_ops: Operations, tmp_path: Path) -> Iterator[tuple[Path, ControlServer]]:
    yield from _serve(mrcd_ops, tmp_path)


class _BuggyOps(Operations):
    def op_qp_stats(self, c: Client, req: dict[str, Any]) -> Any:
        empty: dict[str, int] = {}
        return empty["qpn"]  # a KeyError inside the handler: mrcd's bug, not a bad request


def test_a_handler_bug_reaches_the_client_as_internal_and_mrcd_answers_the_next(
    make_ops: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    gen = _serve(make_ops(_BuggyOps), tmp_path)
    path, server = next(gen)
    with MrcClient(path, timeout=5.0) as c:
        assert c.info["protocol"] == PROTOCOL_VERSION
        with pytest.raises(ProtocolError, match=r"^internal error in op qp_stats") as e:
            c.call("qp_stats", qpn=1)
        assert e.value.kind is ErrorKind.INTERNAL
        assert c.call("qp_show") == []
        with pytest.raises(ProtocolError, match="no QP 7") as e:
            c.call("connect", qpn=7, peer_qpn=1)
        assert e.value.kind is ErrorKind.REFUSED
    assert server.rejected == {"internal": 1, "invalid": 1}
    assert "KeyError: 'qpn'" in capsys.readouterr().err
    next(gen, None)


def test_mrcd_refuses_a_client_of_another_major_version(served: tuple[Path, ControlServer]) -> None:
    path, server = served
    with MrcClient(path, timeout=5.0) as c:
        assert c.call("hello", protocol="1.7")["host"] == "h0"  # a newer minor is fine
        mine = re.escape(PROTOCOL_VERSION)
        want = rf"the client speaks 2\.0 \(newer major\), this side speaks {mine}: upgrade mrcd"
        with pytest.raises(ProtocolError, match="protocol version mismatch: " + want) as e:
            c.call("hello", protocol="2.0")
        assert e.value.kind is ErrorKind.REFUSED
        for bad in ("two", "1.\u00b2", "1." + "9" * 5000):  # superscript 2 is isdigit(); int() refuses it
            with pytest.raises(ProtocolError, match=r"MAJOR\.MINOR") as e:
                c.call("hello", protocol=bad)
            assert e.value.kind is ErrorKind.BAD_REQUEST
        assert c.call("qp_show") == []
    assert server.rejected == {"version": 1, "bad_field": 3}


def test_an_accept_that_fails_for_lack_of_descriptors_is_counted_and_the_loop_goes_on(
    mrcd_ops: Operations, tmp_path: Path
) -> None:
    """accept() failing with EMFILE (mrcd out of descriptors) used to raise out of mrcd's loop and end
    the daemon; the connection now waits in the backlog, counted accept_failed, and is served once
    descriptors are free again."""
    import errno

    server = ControlServer(selectors.DefaultSelector(), mrcd_ops)
    path = tmp_path / "m.sock"
    server.listen(path)
    real = server.sock
    assert real is not None

    class _Full:
        def accept(self) -> Any:
            raise OSError(errno.EMFILE, "Too many open files")

    try:
        peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        peer.connect(str(path))
        server.sock = _Full()  # type: ignore[assignment]
        server.accept()
        server.accept()
        assert server.rejected == {"accept_failed": 2} and not server.clients
        server.sock = real
        server.accept()
        assert len(server.clients) == 1
        peer.close()
    finally:
        server.sock = real
        server.close()


def test_the_client_refuses_an_mrcd_of_another_major_version(tmp_path: Path) -> None:
    path = tmp_path / "new.sock"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(str(path))
    srv.listen(1)

    def serve() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.sendall(b'{"id":0,"ok":{"mrcd":"9","host":"h0","protocol":"2.0"}}\n')
            req = json.loads(conn.recv(4096))
            conn.sendall((json.dumps({"id": req["id"], "ok": {
                "host": "h0", "testbed": "t", "gid": "fd00::1", "planes": 2, "evs": 4, "pid": os.getpid(),
                "version": "9", "peers": [], "link_rate_bps": 1, "protocol": "2.0"}}) + "\n").encode())
            conn.recv(16)

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    with srv, pytest.raises(ProtocolError, match=r"the mrcd speaks 2\.0 \(newer major\).*upgrade the client"):
        MrcClient(path, timeout=5.0)
    t.join(5)


def test_the_documented_ops_are_the_schema_ops() -> None:
    """docs/daemon.md's table of ops is written by hand: it names exactly the ops of the schema."""
    import re
    from pathlib import Path

    from mrc.dataplane.protocol import OPS

    doc = (Path(__file__).resolve().parents[2] / "docs" / "daemon.md").read_text()
    table = doc[doc.index("| op | fields |", doc.index("## Control protocol")):]
    rows = [line for line in table[: table.find("\n\n")].splitlines() if line.startswith("| `")]
    named = {op for row in rows for op in re.findall(r"`([a-z_]+)`", row.split("|")[1])}
    assert named == set(OPS), (sorted(named - set(OPS)), sorted(set(OPS) - named))


# -- requests sent without waiting (MrcClient.call_nowait: the data path's post_send / post_recv)


@pytest.fixture
def client_qp(served: tuple[Path, ControlServer]) -> Iterator[tuple[MrcClient, ClientQp]]:
    """A client of the stub mrcd with one QP toward h2."""
    with MrcClient(served[0], timeout=5.0) as c:
        yield c, c.create_qp("h2")


def test_a_post_sent_without_waiting_that_mrcd_refuses_is_raised_by_the_next_call_naming_it(
    client_qp: tuple[MrcClient, ClientQp]
) -> None:
    c, qp = client_qp
    c.post_recv(qp, 1, wait=False)  # a good one: nothing to raise
    ghost = ClientQp(7, "h2", "fd00::3", None)
    c.post_recv(ghost, 2, wait=False)  # refused by mrcd: no QP 7
    c.post_recv(qp, 3, wait=False)
    want = r"^post_recv \(request \d+, sent without waiting\): .*no QP 7"
    with pytest.raises(ProtocolError, match=want) as e:
        c.call("qp_show")
    assert e.value.kind is ErrorKind.REFUSED
    assert c.call("qp_show") != []  # raised once; the connection and the good posts are fine
    c.post_recv(ghost, 4, wait=False)
    with pytest.raises(ProtocolError, match=r"post_recv .*no QP 7"):
        c.poll_wc(qp, timeout=2.0)  # poll_wc reads the answer and raises it too
    c.post_recv(ghost, 5, wait=False)
    with pytest.raises(ProtocolError, match=r"post_recv .*no QP 7"):
        c.sync()
    c.sync()  # nothing outstanding, nothing to raise
    assert not c._unanswered


def test_requests_sent_without_waiting_are_bounded_and_all_answered(
    client_qp: tuple[MrcClient, ClientQp], served: tuple[Path, ControlServer]
) -> None:
    c, qp = client_qp
    peak = 0
    for wr in range(3 * MAX_UNANSWERED):
        c.post_recv(qp, wr, wait=False)
        peak = max(peak, len(c._unanswered))
    assert peak == MAX_UNANSWERED  # the client read answers rather than let them pile up
    c.sync()
    assert not c._unanswered
    assert qp.qpn in {q["qpn"] for q in c.call("qp_show")}
    assert served[1].rejected == {}


def test_qp_stats_carries_the_congestion_controllers_state(client_qp: tuple[MrcClient, ClientQp]) -> None:
    c, qp = client_qp
    cc = c.call("qp_stats", qpn=qp.qpn)["cc"]
    assert cc["algorithm"] == "uet-1.0-nscc"
    assert {"cwnd", "md_count", "qa_count", "avg_delay_ns", "min_cwnd_seen"} <= set(cc)
    assert cc["md_count"] == cc["qa_count"] == 0 and cc["cwnd"] > 0


def test_qp_show_counts_the_window_cuts_and_mrcctl_shows_them(client_qp: tuple[MrcClient, ClientQp]) -> None:
    from mrc.ctl.cmd_qp import _render

    c, qp = client_qp
    rows = c.call("qp_show")
    assert [r["cc_cuts"] for r in rows if r["qpn"] == qp.qpn] == [{"ecn": 0, "quick_adapt": 0}]
    shown = _render({"qps": rows})
    assert "CUTS ECN/QA" in shown.splitlines()[0] and " 0/0 " in shown
    old = [{k: v for k, v in r.items() if k != "cc_cuts"} for r in rows]  # an mrcd from before
    assert "CUTS ECN/QA" in _render({"qps": old})


def test_the_descriptor_of_a_refused_reg_mr_goes_with_it(mrcd_ops: Operations) -> None:
    """Descriptors wait per client; a reg_mr the schema refused (a misspelt field) used to leave its
    memfd pending, so the client's next reg_mr registered that one instead of its own. The refused
    request's descriptor is closed with it."""
    server = ControlServer(selectors.DefaultSelector(), mrcd_ops)
    a, b = socket.socketpair()
    try:
        c = Client(a, 0)
        fd = os.memfd_create("refused")
        c.fds.append(fd)
        server.request(c, b'{"id": 1, "op": "reg_mr", "length": 4096, "lenght": 1}')
        assert "unknown field 'lenght'" in bytes(c.wbuf).decode()
        assert not c.fds and server.rejected == {"unknown_field": 1}
        with pytest.raises(OSError):
            os.fstat(fd)  # closed
    finally:
        a.close()
        b.close()
