"""mrc.dataplane.sdnotify against a real AF_UNIX datagram socket standing in for systemd's notify socket:
the exact bytes of each message, the abstract namespace, and every failure a False (never an exception)."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mrc.dataplane import sdnotify


@pytest.fixture
def notify_sock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A bound SOCK_DGRAM socket in tmp_path, named by $NOTIFY_SOCKET (watchdog variables cleared)."""
    for var in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "notify"
    sk = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sk.bind(str(path))
    sk.settimeout(2.0)
    monkeypatch.setenv("NOTIFY_SOCKET", str(path))
    try:
        yield sk
    finally:
        sk.close()


def _nothing_queued(sk: socket.socket) -> bool:
    sk.setblocking(False)
    try:
        sk.recv(4096)
    except BlockingIOError:
        return True
    return False


@pytest.mark.parametrize(("call", "expected"), [
    (lambda: sdnotify.notify("READY=1"), b"READY=1"),
    (lambda: sdnotify.ready(), b"READY=1"),
    (lambda: sdnotify.ready("serving /run/mrc/h0.sock"), b"READY=1\nSTATUS=serving /run/mrc/h0.sock"),
    (lambda: sdnotify.stopping(), b"STOPPING=1"),
    (lambda: sdnotify.stopping("removing paths"), b"STOPPING=1\nSTATUS=removing paths"),
    (lambda: sdnotify.status("3 peers, 1 link denied"), b"STATUS=3 peers, 1 link denied"),
    (lambda: sdnotify.watchdog(), b"WATCHDOG=1"),
    # a newline in a status would smuggle in another assignment: it is folded into a space
    (lambda: sdnotify.status("a\nREADY=1"), b"STATUS=a READY=1"),
    (lambda: sdnotify.notify("STATUS=h\u00e9"), "STATUS=h\u00e9".encode()),
])
def test_exact_datagram(notify_sock: socket.socket, call, expected: bytes) -> None:
    assert call() is True
    assert notify_sock.recv(4096) == expected
    assert _nothing_queued(notify_sock), "one call, one datagram"


def test_abstract_namespace(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"mrc-test-sdnotify-{os.getpid()}"
    sk = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        sk.bind(b"\0" + name.encode())
        sk.settimeout(2.0)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sdnotify.ready("up") is True
        assert sk.recv(4096) == b"READY=1\nSTATUS=up"
    finally:
        sk.close()


def test_forked_child_never_notifies(notify_sock: socket.socket) -> None:
    """A child forked without exec inherited the parent's handlers: its ready()/stopping() are no-ops."""
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only when every call was refused
        try:
            os._exit(0 if not (sdnotify.stopping() or sdnotify.ready() or sdnotify.watchdog()) else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert _nothing_queued(notify_sock)
    assert sdnotify.ready() is True  # the parent still speaks


def test_unset_sends_nothing(notify_sock: socket.socket, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert sdnotify.notify("READY=1") is False
    assert sdnotify.ready("x") is False
    assert sdnotify.stopping() is False
    assert sdnotify.watchdog() is False
    assert _nothing_queued(notify_sock)


@pytest.mark.parametrize("value", ["", "relative/path", "@", "vsock:2:1234"])
def test_unusable_address_is_false(notify_sock: socket.socket, monkeypatch: pytest.MonkeyPatch,
                                   value: str) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", value)
    assert sdnotify.ready() is False
    assert _nothing_queued(notify_sock)


def test_missing_socket_is_false_not_an_exception(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "gone"))
    assert sdnotify.ready() is False
    assert sdnotify.watchdog() is False


def test_socket_removed_after_start(notify_sock: socket.socket, tmp_path: Path) -> None:
    assert sdnotify.ready() is True
    (tmp_path / "notify").unlink()
    notify_sock.close()
    assert sdnotify.stopping() is False


def test_not_a_datagram_socket_is_false(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "stream"
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        srv.bind(str(path))
        srv.listen(1)
        monkeypatch.setenv("NOTIFY_SOCKET", str(path))
        assert sdnotify.ready() is False  # EPROTOTYPE
    finally:
        srv.close()
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "file"))
    assert sdnotify.ready() is False  # ECONNREFUSED


def test_full_queue_is_false_within_the_timeout(notify_sock: socket.socket) -> None:
    """Nobody reads: the sends eventually fail (queue full) instead of blocking the caller for good."""
    assert sdnotify.status("first") is True
    t0 = time.monotonic()
    for _ in range(5000):  # net.unix.max_dgram_qlen unread datagrams (Linux default 10) fill it
        if not sdnotify.status("x" * 1024):
            break
    else:
        pytest.fail("5000 unread datagrams and no send failed")
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize(("usec", "pid", "expected"), [
    (None, None, None),
    ("30000000", None, 30.0),
    ("500000", "self", 0.5),
    ("500000", "1", None),       # meant for another process (inherited by a child)
    ("500000", "x", None),
    ("0", None, None),
    ("-5", None, None),
    ("soon", None, None),
])
def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None,
                           expected: float | None) -> None:
    for var, val in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if val is None:
            monkeypatch.delenv(var, raising=False)
        else:
            monkeypatch.setenv(var, str(os.getpid()) if val == "self" else val)
    if pid == "1" and os.getpid() == 1:
        pytest.skip("this test process is PID 1")
    assert sdnotify.watchdog_interval_s() == expected


def test_watchdog_thread_pings_while_the_loop_turns(notify_sock: socket.socket,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # 0.2 s: a ping every 0.05 s while fresh
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    turned = [time.monotonic()]
    stop = threading.Event()
    t = sdnotify.start_watchdog(lambda: turned[0], stop)
    assert t is not None and t.daemon
    try:
        for _ in range(3):
            turned[0] = time.monotonic()
            assert notify_sock.recv(4096) == b"WATCHDOG=1"
        turned[0] = time.monotonic() - 1.0  # the loop stopped turning: pings stop
        time.sleep(0.15)
        while not _nothing_queued(notify_sock):  # drain what was sent before it noticed
            pass
        time.sleep(0.3)
        assert _nothing_queued(notify_sock), "a stale loop must not be pinged for"
    finally:
        stop.set()
        t.join(2)
    assert not t.is_alive()


def test_watchdog_thread_survives_a_failing_heartbeat(notify_sock: socket.socket,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "100000")
    stop = threading.Event()

    def broken() -> float:
        raise RuntimeError("no heartbeat")

    t = sdnotify.start_watchdog(broken, stop)
    assert t is not None
    time.sleep(0.1)
    assert t.is_alive() and _nothing_queued(notify_sock)
    stop.set()
    t.join(2)


def test_no_watchdog_no_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    assert sdnotify.start_watchdog(time.monotonic) is None
