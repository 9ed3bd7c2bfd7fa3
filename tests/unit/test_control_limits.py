"""mrcd's control socket under hostile load: a connection flood, a pipelining client, a client that stops
reading, descriptors beyond the control buffer, descriptor exhaustion at accept, and work requests
without end. Each is bounded and counted by reason, and the loop keeps turning."""

from __future__ import annotations

import array
import contextlib
import errno
import json
import os
import resource
import selectors
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mrc.ctl import control_server as cs
from mrc.ctl import daemon as mrcd
from mrc.ctl import operations as opsmod
from mrc.ctl.control_server import Client, ControlServer
from mrc.ctl.operations import Operations
from mrc.dataplane.protocol import RejectReason


@pytest.fixture
def server(mrcd_ops: Operations, tmp_path: Path) -> Iterator[ControlServer]:
    srv = ControlServer(selectors.DefaultSelector(), mrcd_ops)
    srv.listen(tmp_path / "m.sock")
    try:
        yield srv
    finally:
        srv.close()


def _turn(srv: ControlServer, timeout: float = 0.2) -> None:
    """One turn of mrcd's loop, as far as the control socket goes."""
    srv.begin_turn()
    for key, mask in srv.sel.select(0 if srv.busy else timeout):
        if key.data is srv:
            srv.accept()
        else:
            srv.on_io(key.data, mask)
    srv.flush()


def _connect(srv: ControlServer) -> socket.socket:
    assert srv.path is not None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(str(srv.path))
    return s


def _lines(s: socket.socket, n: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    s.settimeout(timeout)
    buf = b""
    while buf.count(b"\n") < n:
        chunk = s.recv(1 << 16)
        if not chunk:
            break
        buf += chunk
    return [json.loads(x) for x in buf.split(b"\n") if x]


def test_connections_beyond_the_limit_are_refused_with_a_message_and_counted(
    server: ControlServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cs, "MAX_CLIENTS", 3)
    socks = [_connect(server) for _ in range(5)]
    try:
        for _ in range(5):
            _turn(server, 0.05)
        assert len(server.clients) == 3
        assert server.rejected == {RejectReason.TOO_MANY_CLIENTS: 2}
        refused = [s for s in socks[3:]]
        for s in refused:
            (doc,) = _lines(s, 1)
            assert "serves 3 control connections" in doc["error"]
            assert s.recv(1) == b""  # closed
        socks[0].close()  # one leaves: a new one is served
        for _ in range(3):
            _turn(server, 0.05)
        late = _connect(server)
        socks.append(late)
        _turn(server, 0.05)
        _turn(server, 0.05)
        assert len(server.clients) == 3
        assert "ok" in _lines(late, 1)[0]
    finally:
        for s in socks:
            s.close()


def test_a_pipelining_client_is_served_over_several_turns_and_every_request_answered(
    server: ControlServer,
) -> None:
    """Thousands of requests in one write used to be answered in one turn (seconds of mrcd's loop with
    no engine work); a turn now answers at most MAX_LINES_PER_TURN, the rest the following turns."""
    n = 3 * cs.MAX_LINES_PER_TURN + 5
    s = _connect(server)
    try:
        _turn(server)
        s.sendall(b"".join(b'{"id":%d,"op":"qp_show"}\n' % (i + 1) for i in range(n)))
        time.sleep(0.05)
        answered: list[bytes] = []
        turns = 0
        while len(answered) < n + 1 and turns < 50:
            before = server.budget
            _turn(server, 0.05)
            turns += 1
            assert cs.MAX_LINES_PER_TURN - server.budget <= cs.MAX_LINES_PER_TURN and before >= 0
            s.setblocking(False)
            try:
                while True:
                    chunk = s.recv(1 << 20)
                    if not chunk:
                        break
                    answered += [x for x in chunk.split(b"\n") if x]
            except BlockingIOError:
                pass
        ids = [json.loads(x)["id"] for x in answered]
        assert ids == list(range(n + 1))  # greeting (id 0), then every request, in order
        assert turns >= 4  # n needs at least four turns' budgets
        assert not server.busy and server.rejected == {}
    finally:
        s.close()


def test_a_pipelining_client_does_not_starve_the_others(server: ControlServer) -> None:
    """The turn's budget is shared: a client with thousands of lines waiting gets MAX_LINES_PER_CLIENT
    of them per turn, and another client's request is answered in the turn it arrives (with the budget
    alone, the waiting pipeline took every turn's budget first and the other client waited for all of
    it), while the pipelining client is not read further until its lines are answered."""
    a, b = _connect(server), _connect(server)
    try:
        _turn(server)
        _turn(server)
        n = 3 * cs.MAX_LINES_PER_TURN
        a.sendall(b'{"id":1,"op":"qp_show"}\n' * n)
        time.sleep(0.05)
        _turn(server)
        (ca,) = server.backlog.values()
        assert ca.rbuf.count(b"\n") > 0 and server.busy
        b.sendall(b'{"id":2,"op":"qp_show"}\n' * 3)
        time.sleep(0.05)
        _turn(server)  # a's turn share first (it waited), then b's three lines
        b.setblocking(False)
        assert [json.loads(x)["id"] for x in b.recv(1 << 16).split(b"\n") if x] == [0, 2, 2, 2]
        for _ in range(200):
            _turn(server, 0.05)
            if not server.busy:
                break
        assert not server.busy
        assert len(_lines(a, n + 1)) == n + 1
    finally:
        a.close()
        b.close()


def test_dropping_a_client_that_does_not_read_never_blocks_the_loop(server: ControlServer) -> None:
    """drop() used to send the client's queued replies blocking, up to a second per client: a client
    that half-closes and never reads stalled mrcd's loop. Its replies now linger in the background."""
    s = _connect(server)
    try:
        _turn(server)
        (c,) = server.clients.values()
        c.wbuf += b"x" * (8 << 20)  # far more than the socket buffer takes
        server.drop(c)
        assert c.sock.gettimeout() == 0.0  # still non-blocking: drop sent what the socket took, no more
        assert c.wbuf and not server.clients and server.lingering and c.closing_at
        c.closing_at = time.monotonic() - 1  # its time is up
        server.flush()
        assert not server.lingering and c.sock.fileno() < 0 and not c.wbuf
    finally:
        s.close()


def test_a_half_closed_client_still_gets_its_answers(server: ControlServer) -> None:
    s = _connect(server)
    try:
        s.sendall(b'{"id":5,"op":"qp_show"}\n')
        s.shutdown(socket.SHUT_WR)
        for _ in range(6):
            _turn(server, 0.05)
        got = _lines(s, 2)
        assert [d["id"] for d in got] == [0, 5] and got[1]["ok"] == []
        assert not server.clients and not server.lingering
    finally:
        s.close()


def test_descriptors_cut_off_by_the_control_buffer_are_counted(server: ControlServer) -> None:
    s = _connect(server)
    fds = [os.memfd_create(f"f{i}") for i in range(cs.MAX_PENDING_FDS + 8)]
    try:
        _turn(server)
        s.sendmsg([b"\n"], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())])
        _turn(server)
        (c,) = server.clients.values()
        assert len(c.fds) == cs.MAX_PENDING_FDS
        assert server.rejected.get(RejectReason.TOO_MANY_FDS) == 1  # MSG_CTRUNC: the kernel dropped 8
    finally:
        for fd in fds:
            os.close(fd)
        s.close()


def test_a_failed_accept_rests_the_listening_socket_instead_of_spinning(
    server: ControlServer,
) -> None:
    real = server.sock
    assert real is not None
    real_fd = real.fileno()

    class _Full:
        def accept(self) -> Any:
            raise OSError(errno.EMFILE, "Too many open files")

        def fileno(self) -> int:
            return real_fd

    peer = _connect(server)
    try:
        server.sock = _Full()  # type: ignore[assignment]
        server.accept()
        assert server.rejected == {RejectReason.ACCEPT_FAILED: 1}
        with pytest.raises(KeyError):
            server.sel.get_key(real)  # resting: select does not wake for it, the loop does not spin
        assert server.sel.select(0) == []
        server.sock = real
        server.accept_rest_until = time.monotonic() - 1
        _turn(server)  # back, and the waiting connection is served
        _turn(server)
        assert len(server.clients) == 1
    finally:
        server.sock = real
        peer.close()


def test_a_clients_work_requests_are_bounded_in_mrcd(
    mrcd_ops: Operations, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(opsmod, "MAX_CLIENT_WRS", 40)
    srv = ControlServer(selectors.DefaultSelector(), mrcd_ops)
    a, b = socket.socketpair()
    try:
        c = Client(a, 0)
        qpns = []
        for i in range(2):
            srv.request(c, b'{"id":%d,"op":"create_qp","peer":"h2"}' % (i + 1))
            qpns.append(json.loads(bytes(c.wbuf).splitlines()[-1])["ok"]["qpn"])
        for i in range(45):
            srv.request(c, b'{"id":%d,"op":"post_recv","qpn":%d,"wr_id":%d}' % (10 + i, qpns[i % 2], i))
        replies = [json.loads(x) for x in bytes(c.wbuf).splitlines()[2:]]
        assert [r.get("ok", "refused") for r in replies] == [None] * 40 + ["refused"] * 5
        assert "holds 40 work requests" in replies[-1]["error"] and replies[-1]["kind"] == "refused"
        assert srv.rejected == {RejectReason.QUEUE_FULL: 5}
        held = sum(len(mrcd_ops.e.ctx.qps[q].recv_q) for q in qpns)
        assert held == 40
        srv.request(c, b'{"id":99,"op":"destroy_qp","qpn":%d}' % qpns[0])  # frees 20
        srv.request(c, b'{"id":100,"op":"post_recv","qpn":%d,"wr_id":1}' % qpns[1])
        assert json.loads(bytes(c.wbuf).splitlines()[-1]) == {"id": 100, "ok": None}
    finally:
        srv.handler.client_gone(c)
        a.close()
        b.close()


def test_mrcd_raises_its_descriptor_limit_for_its_memory_regions() -> None:
    """Python's mmap keeps a duplicate of each region's memfd: at the usual soft limit of 1024, reg_mr
    failed near the 1000th region although mrcd takes MAX_MRS."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
        mrcd._raise_nofile()
        now, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = mrcd.NOFILE_WANTED if hard == resource.RLIM_INFINITY else min(mrcd.NOFILE_WANTED, hard)
        assert now == want and now > 1024
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_waiting_client_that_stops_reading_does_not_keep_the_loop_awake(
    server: ControlServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client left with lines by the budget (the loop does not sleep while any is) whose replies then
    pile up is paused until it reads: it must leave the backlog, or mrcd's loop turned at 100 % CPU
    with nothing to do until the client read."""
    monkeypatch.setattr(cs, "MAX_QUEUED_REPLY_BYTES", 2048)
    s = _connect(server)
    try:
        _turn(server)
        s.sendall(b'{"id":1,"op":"qp_show"}\n' * (4 * cs.MAX_LINES_PER_CLIENT))
        time.sleep(0.05)
        (c,) = server.clients.values()
        c.wbuf += b"x" * 1000  # replies it has not read yet
        server.begin_turn()
        server.on_io(c, selectors.EVENT_READ)  # its share answered, the rest waits for the budget
        assert server.busy
        c.wbuf += b"x" * 4096  # ... and it still reads nothing
        server.begin_turn()
        assert c.paused and not server.busy  # waiting for the client now, not for the loop
        server.flush()  # it reads: answered again, in order
        s.setblocking(False)
        got = b""
        for _ in range(200):
            with contextlib.suppress(BlockingIOError):
                got += s.recv(1 << 20)
            _turn(server, 0.01)
            if got.count(b"\n") >= 4 * cs.MAX_LINES_PER_CLIENT + 1:
                break
        ids = [json.loads(x)["id"] for x in got.replace(b"x", b"").split(b"\n") if x]
        assert ids == [0] + [1] * (4 * cs.MAX_LINES_PER_CLIENT)
    finally:
        s.close()


def _stuff(c: Client) -> None:
    """Fill the client's socket from mrcd's side, as a client that has stopped reading has."""
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    with contextlib.suppress(BlockingIOError):
        while True:
            c.sock.send(b" " * 4096)


def test_slow_readers_together_are_bounded_and_readers_are_still_served(
    server: ControlServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each slow reader stays under its own 4 MiB, but all of them together may not hold more than the
    total: past it, a client holding more than the floor is paused; one that reads is answered; the
    paused ones resume, in order, once the total is back under it."""
    monkeypatch.setattr(cs, "MAX_TOTAL_QUEUED_REPLY_BYTES", 8192)
    monkeypatch.setattr(cs, "REPLY_FLOOR_BYTES", 1024)
    slow = [_connect(server) for _ in range(3)]
    reader = _connect(server)
    try:
        for _ in range(20):
            if len(server.clients) == 4:
                break
            _turn(server, 0.02)
        assert len(server.clients) == 4
        clients = list(server.clients.values())  # in the order they connected (the listen backlog's)
        for c in clients[:3]:
            _stuff(c)
            c.wbuf += b"x" * 4000  # replies none of them has read
        server.flush()
        assert server.queued == 12000
        for s in slow:
            s.sendall(b'{"id":7,"op":"qp_show"}\n')
        _lines(reader, 1)  # the greeting
        reader.sendall(b'{"id":8,"op":"qp_show"}\n')
        for _ in range(5):
            _turn(server, 0.02)
        assert [c.paused for c in clients[:3]] == [True, True, True]
        assert [len(c.wbuf) for c in clients[:3]] == [4000, 4000, 4000]  # nothing more queued for them
        assert [d["id"] for d in _lines(reader, 1)] == [8]
        # two of them catch up: the total is back under the bound, and the third, still not reading, is
        # answered again (under its own limit)
        for c in clients[:2]:
            c.wbuf.clear()
        server.flush()
        assert server.queued == 4000
        _turn(server, 0.02)
        assert not clients[2].paused
        assert bytes(clients[2].wbuf).startswith(b"x" * 4000 + b'{"id":7,"ok":')
    finally:
        for s in [*slow, reader]:
            s.close()


def test_the_socket_path_replaces_only_a_dead_socket(mrcd_ops: Operations, tmp_path: Path) -> None:
    """mrcd runs as root and used to unlink whatever was at its socket path, and again at exit: a file
    named there was lost, a live mrcd's socket taken over. Only a socket nobody listens on is replaced;
    a file, a directory or a live socket is an MrcError and stays; and at exit mrcd removes its own
    socket only, not one that replaced it since."""
    from mrc.errors import MrcError

    f = tmp_path / "precious"
    f.write_text("keep me")
    for target, says in ((f, "not a socket"), (tmp_path, "a directory")):
        srv = ControlServer(selectors.DefaultSelector(), mrcd_ops)
        with pytest.raises(MrcError, match=says):
            srv.listen(target)
        srv.close()
    assert f.read_text() == "keep me"
    live = ControlServer(selectors.DefaultSelector(), mrcd_ops)
    live.listen(tmp_path / "live.sock")
    try:
        other = ControlServer(selectors.DefaultSelector(), mrcd_ops)
        with pytest.raises(MrcError, match="another process listens"):
            other.listen(tmp_path / "live.sock")
        other.close()
        assert (tmp_path / "live.sock").exists()
    finally:
        live.close()
    assert not (tmp_path / "live.sock").exists()
    dead = tmp_path / "dead.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(dead))  # a killed mrcd's: bound, nobody accepting
    first = ControlServer(selectors.DefaultSelector(), mrcd_ops)
    first.listen(dead)
    dead.unlink()  # replaced by another's socket while it runs ...
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(dead))
        first.close()
        assert dead.exists()  # ... which its exit leaves alone


def test_metrics_that_never_started_shut_down_at_once() -> None:
    """mrcd binds /metrics first and serves it once it has started; when the start failed in between
    (its control socket, say), closing waited for ever for a server loop that never ran, the dataplane
    still installed and SIGTERM without effect."""
    import threading

    from mrc.ctl.metrics import MetricsServer

    m = MetricsServer("127.0.0.1", 0)
    t = threading.Thread(target=m.shutdown, daemon=True)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive()
