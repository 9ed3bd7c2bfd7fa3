"""A dependency-free sd_notify(3) client: how mrcd tells systemd it is ready, stopping, or still alive.

systemd starts a ``Type=notify`` service with ``$NOTIFY_SOCKET`` set to an AF_UNIX datagram socket (a path,
or an abstract name written with a leading ``@``); the service sends newline-separated ``KEY=VALUE``
assignments to it (``READY=1``, ``STOPPING=1``, ``STATUS=...``, ``WATCHDOG=1``). With ``WatchdogSec=`` set,
systemd also passes ``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``, the process it is meant for) and expects a
``WATCHDOG=1`` at least that often.

Every function here is a no-op returning False when the service was not started by systemd
(``$NOTIFY_SOCKET`` unset) or when called in a child forked (without exec) from the service, and none
of them ever raises because of the socket: a daemon must not die because the notify socket went away
(systemd restarted, the socket file removed, the queue full). They return True when the datagram was
handed to the kernel.

    from mrc.dataplane import sdnotify
    sdnotify.ready("serving /run/mrc/h0.sock")     # READY=1 + STATUS=...
    ...
    sdnotify.stopping()                             # on SIGTERM, before the cleanup
    sdnotify.start_watchdog(lambda: d.turned)       # WATCHDOG=1 while the main loop keeps turning
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Final

SEND_TIMEOUT_S: Final = 0.25  # a full receive queue must not stall the caller's loop for long

# A child forked without exec (pyroute2's namespace helpers, multiprocessing) inherits the parent's
# signal handlers and would send the parent's STOPPING=1 when it is terminated: it never speaks.
# (systemd's NotifyAccess=main refuses it anyway, with a warning in the journal each time.)
_forked_child = False


def _after_fork_in_child() -> None:
    global _forked_child
    _forked_child = True


os.register_at_fork(after_in_child=_after_fork_in_child)


def _address(raw: str) -> str | bytes | None:
    """The socket address of ``$NOTIFY_SOCKET``: an absolute path, or ``@name`` for the abstract
    namespace (a leading NUL byte on the wire). Anything else (relative, empty, ``vsock:...``) is
    not an address this client can reach: None."""
    if raw.startswith("@") and len(raw) > 1:
        return b"\0" + raw[1:].encode()
    if raw.startswith("/"):
        return raw
    return None


def _one_line(text: str) -> str:
    """A value on one line: a newline in it would start another assignment (``STATUS=x\\nREADY=1``)."""
    return " ".join(text.splitlines())


def notify(state: str) -> bool:
    """Send `state` (newline-separated ``KEY=VALUE`` assignments, sent as they are) to ``$NOTIFY_SOCKET``.
    False, with nothing sent, when it is unset or unusable, or in a forked child of the process that
    imported this module; False when the send fails; never raises."""
    raw = os.environ.get("NOTIFY_SOCKET")
    if not raw or _forked_child:
        return False
    addr = _address(raw)
    if addr is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sk:
            sk.settimeout(SEND_TIMEOUT_S)
            data = state.encode("utf-8", "replace")
            return sk.sendto(data, socket.MSG_NOSIGNAL, addr) == len(data)
    except (OSError, ValueError):
        # OSError: no such socket, refused, queue full past the timeout, too big; ValueError: a NUL in
        # a path name. Either way systemd does not hear us, and the daemon carries on.
        return False


def ready(status: str | None = None) -> bool:
    """``READY=1`` (and ``STATUS=status`` in the same datagram): the service is up; systemd starts
    what is ordered after it and ``systemctl start`` returns."""
    return notify("READY=1" if status is None else f"READY=1\nSTATUS={_one_line(status)}")


def stopping(status: str | None = None) -> bool:
    """``STOPPING=1``: the service is shutting down (sent on SIGTERM, before the cleanup)."""
    return notify("STOPPING=1" if status is None else f"STOPPING=1\nSTATUS={_one_line(status)}")


def status(text: str) -> bool:
    """``STATUS=text``: one line shown by ``systemctl status``."""
    return notify(f"STATUS={_one_line(text)}")


def watchdog() -> bool:
    """``WATCHDOG=1``: the keep-alive ping ``WatchdogSec=`` asks for."""
    return notify("WATCHDOG=1")


def watchdog_interval_s() -> float | None:
    """The watchdog period systemd expects pings within (``$WATCHDOG_USEC``, in seconds), or None when
    no watchdog is set, the value is not a positive integer, or ``$WATCHDOG_PID`` names another process
    (the variables were inherited by a child). Ping at half of it, as sd_watchdog_enabled(3) advises."""
    usec = os.environ.get("WATCHDOG_USEC")
    if not usec:
        return None
    try:
        n = int(usec)
    except ValueError:
        return None
    if n <= 0:
        return None
    pid = os.environ.get("WATCHDOG_PID")
    if pid:
        try:
            if int(pid) != os.getpid():
                return None
        except ValueError:
            return None
    return n / 1_000_000


def start_watchdog(last_turn: Callable[[], float], stop: threading.Event | None = None,
                   *, name: str = "sd-watchdog") -> threading.Thread | None:
    """When systemd expects keep-alive pings (``WatchdogSec=``, `watchdog_interval_s`): start a daemon
    thread that sends ``WATCHDOG=1`` every quarter of the period while ``last_turn()`` (the
    ``time.monotonic()`` at which the caller's main loop last completed a turn) is younger than half of
    it. A wedged loop stops the pings and systemd restarts the service; a turning one costs one datagram
    per quarter period. Without a watchdog: None, nothing started. Setting `stop` ends the thread."""
    period = watchdog_interval_s()
    if period is None:
        return None
    halt = stop if stop is not None else threading.Event()

    def _run() -> None:
        while not halt.is_set():
            try:
                fresh = time.monotonic() - last_turn() < period / 2
            except Exception:
                fresh = False  # the heartbeat itself failed: say nothing, let systemd decide
            if fresh:
                watchdog()
            halt.wait(period / 4)

    t = threading.Thread(target=_run, name=name, daemon=True)
    t.start()
    return t
