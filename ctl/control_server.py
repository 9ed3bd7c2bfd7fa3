"""mrcd's control socket: accept (root only), read request lines, answer each with exactly one reply, push
work completions, and drop a client with everything it owned. Which operations exist and what they do is
the handler's business (`Handler`: mrcd's `Operations`); this module only frames, validates and dispatches.

Why separate: the framing rules (line limit, JSON without NaN, the shared schema of
`mrc.dataplane.protocol`, refused vs internal errors) are the same for every operation and are tested on
their own, with a small handler, without an engine.
"""

from __future__ import annotations

import array
import contextlib
import json
import mmap
import os
import selectors
import socket
import stat
import struct
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final, Protocol

from mrc.dataplane.client import check_socket_path
from mrc.dataplane.protocol import MAX_REQUEST_BYTES as _MAX_REQUEST_LINE
from mrc.dataplane.protocol import OPS, ErrorKind, ProtocolError, RejectReason, validate_request
from mrc.errors import MrcError
from mrc.transport import MemoryRegion, QueueFull

SO_PEERCRED_FMT: Final = "3i"
#: The longest control-socket request line; a longer one is answered with an error and skipped. The
#: protocol's (`mrc.dataplane.protocol`), which the client checks its requests against before sending.
MAX_REQUEST_BYTES: Final = _MAX_REQUEST_LINE
#: Descriptors (SCM_RIGHTS) a client may have sent that no request has taken yet: reg_mr takes one per
#: request; more are closed on arrival and counted (rejected "too_many_fds"), so that a client cannot
#: run mrcd out of descriptors.
MAX_PENDING_FDS: Final = 16
#: Reply bytes queued for one client beyond which mrcd reads no more of its requests until the client has
#: read most of them (flow control, as a socket buffer): a client that sends requests and never reads,
#: or reads slowly, cannot make mrcd hold its answers without bound (qp_show alone can answer KiBs to a
#: 30-byte request). Reading resumes below a quarter of it.
MAX_QUEUED_REPLY_BYTES: Final = 4 << 20
#: Reply bytes queued for all clients together (lingering ones included) beyond which a client holding
#: more than REPLY_FLOOR_BYTES of unread replies is not read either, until the total is back under it:
#: MAX_CLIENTS slow readers at MAX_QUEUED_REPLY_BYTES each would otherwise hold a GiB. Clients that read
#: their answers (holding less than the floor) are served as before.
MAX_TOTAL_QUEUED_REPLY_BYTES: Final = 64 << 20
REPLY_FLOOR_BYTES: Final = 64 << 10
#: How long a dropped client's unsent replies may take to go out (in the background: the loop does not
#: wait for them) before its socket is closed.
LINGER_S: Final = 1.0
#: Connections served at once, lingering ones included: each holds a descriptor and up to
#: MAX_QUEUED_REPLY_BYTES + 1 MiB of buffers, so a connection flood is refused (too_many_clients)
#: rather than running mrcd out of descriptors or memory.
MAX_CLIENTS: Final = 256
#: Request lines answered per loop turn, all clients together: a client that pipelines thousands of
#: requests is served over several turns, between which the engine runs (its datagrams, timers), instead
#: of holding the loop for seconds. Clients left with complete lines are served first next turn.
MAX_LINES_PER_TURN: Final = 256
#: ... and at most this many of them for one client, so that one pipelining client cannot take a whole
#: turn's budget from the others (a client that sends one request gets its answer within the turn).
MAX_LINES_PER_CLIENT: Final = 32
#: After accept() fails for want of descriptors the listening socket rests this long (it stays readable
#: while the connection waits in the backlog: retrying at once would spin the loop).
ACCEPT_RETRY_S: Final = 0.05


class RequestRejected(ProtocolError):
    """A control-socket line that is not a request at all (too long, not JSON, not an object, no string
    `op`): always `bad_request` to the client; `reason` keys the rejection counter."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(ErrorKind.BAD_REQUEST, reason, message)


def _no_constants(name: str) -> Any:
    raise RequestRejected(RejectReason.BAD_JSON, f"bad request: {name} is not a JSON number")


def parse_request(line: bytes) -> dict[str, Any]:
    """One request line -> its object, or RequestRejected: JSON (no NaN/Infinity, nesting within the
    parser's limits), an object, with a string `op`."""
    if len(line) > MAX_REQUEST_BYTES:
        raise RequestRejected(RejectReason.TOO_LONG, f"bad request: longer than {MAX_REQUEST_BYTES} bytes")
    try:
        req = json.loads(line, parse_constant=_no_constants)
    except RecursionError:
        raise RequestRejected(RejectReason.BAD_JSON, "bad request: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise RequestRejected(RejectReason.BAD_JSON, f"bad request: not JSON ({e})") from None
    if not isinstance(req, dict):
        raise RequestRejected(RejectReason.NOT_OBJECT, "bad request: a request is a JSON object")
    if not isinstance(req.get("op"), str):
        raise RequestRejected(RejectReason.BAD_OP, "bad request: 'op' must be a string")
    return req


@dataclass
class Client:
    """One control-socket connection and what it owns (its QPs and memory regions go when it goes)."""

    sock: socket.socket
    uid: int
    rbuf: bytearray = field(default_factory=bytearray)
    fds: deque[int] = field(default_factory=deque)  # SCM_RIGHTS fds not consumed yet (reg_mr)
    qps: set[int] = field(default_factory=set)
    mrs: dict[int, tuple[MemoryRegion, mmap.mmap]] = field(default_factory=dict)
    wbuf: bytearray = field(default_factory=bytearray)
    skipping: bool = False  # discarding the rest of an over-long line
    paused: bool = False  # not read until it takes its replies (MAX_QUEUED_REPLY_BYTES)
    closing_at: float = 0.0  # dropped: its last replies go out until this monotonic time (LINGER_S)
    wr_bound: int = 0  # an upper bound of its outstanding work requests (Operations' budget)


Operation = Callable[[Client, dict[str, Any]], Any]


class Handler(Protocol):
    def greeting(self) -> dict[str, Any]:
        """The first line's `ok` document (who answers, which protocol)."""

    def operation(self, op: str) -> Operation:
        """The handler of a validated `op` (the schema guarantees it exists)."""

    def client_gone(self, c: Client) -> None:
        """Release what the client owned (its QPs, memory regions)."""


def push(c: Client, doc: dict[str, Any]) -> None:
    """Queue one line for the client (sent by `ControlServer.flush`)."""
    c.wbuf += (json.dumps(doc, separators=(",", ":")) + "\n").encode()


def _clear_stale_socket(path: Path) -> None:
    """Remove `path` when it is a unix socket nobody accepts on (what a killed mrcd leaves); MrcError when
    it is anything else (a file, a directory, a live socket: another mrcd)."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    except OSError as e:
        raise MrcError(f"control socket {path}: {e.strerror or e}") from None
    if not stat.S_ISSOCK(st.st_mode):
        kind = "a directory" if stat.S_ISDIR(st.st_mode) else "a file that is not a socket"
        raise MrcError(f"control socket {path}: {kind} is there; mrcd replaces only a socket (name another "
                       "path, or remove it)")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(str(path))
    except (ConnectionRefusedError, FileNotFoundError):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # nobody listens: a dead mrcd's
        return
    except OSError as e:  # a timeout (a full backlog) or worse: a live listener may be there, kept
        raise MrcError(f"control socket {path}: cannot tell whether another process listens on it "
                       f"({e.strerror or e}); stop it or name another path") from None
    finally:
        probe.close()
    raise MrcError(f"control socket {path}: another process listens on it (another mrcd?)")


class ControlServer:
    """The listening socket and its clients, in the daemon's selector (`listen` registers the socket with
    this server as its key data, each client with its `Client`)."""

    def __init__(self, sel: selectors.BaseSelector, handler: Handler, *, log: IO[str] | None = None) -> None:
        self.sel = sel
        self.handler = handler
        self.log = log
        self.sock: socket.socket | None = None
        self.path: Path | None = None
        self._inode = -1  # of the socket file we bound (close removes only that one)
        self.clients: dict[int, Client] = {}
        self.rejected: dict[str, int] = {}  # requests refused, by reason (mrc_control_rejected_total)
        self.paused_total = 0  # times a client's reading stopped because its replies piled up
        self.budget = MAX_LINES_PER_TURN  # request lines this turn may still answer
        self.backlog: dict[int, Client] = {}  # clients with complete lines left by the budget, in order
        self.lingering: dict[int, Client] = {}  # dropped clients whose last replies are going out
        self.queued = 0  # reply bytes queued for every client, as of the last flush
        self.accept_rest_until = 0.0  # > 0: the listening socket rests after a failed accept

    def _count(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def listen(self, path: Path) -> None:
        """Bind `path` (mode 0600 from the start: root only) and listen without blocking; a path too long
        for a unix socket is an MrcError naming it and the limit. Only a socket nobody listens on (a
        crashed mrcd's) is replaced: anything else at the path is refused, since mrcd runs as root and
        used to unlink whatever was there (a configured `/etc/passwd` went, and so did a live socket)."""
        check_socket_path(path)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise MrcError(f"control socket {path}: cannot create {path.parent}: {e.strerror or e}") from None
        _clear_stale_socket(path)
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            srv.bind(str(path))
        except OSError as e:
            srv.close()
            raise MrcError(f"control socket {path}: {e.strerror or e}") from None
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        self._inode = path.stat().st_ino
        srv.listen(64)
        srv.setblocking(False)
        self.sock, self.path = srv, path
        self.sel.register(srv, selectors.EVENT_READ, self)

    def close(self) -> None:
        for c in list(self.clients.values()):
            self.drop(c)
        for c in list(self.lingering.values()):
            self._close(c)
        if self.sock is not None and not self.accept_rest_until:
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(self.sock)
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            if self.path is not None:  # ours only: not what replaced it since (another mrcd's socket)
                with contextlib.suppress(OSError):
                    if self.path.stat().st_ino == self._inode:
                        self.path.unlink()

    def accept(self) -> None:
        assert self.sock is not None
        try:
            conn, _ = self.sock.accept()
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            # EMFILE / ENFILE / ENOBUFS: the connection waits in the backlog; mrcd's loop goes on (it
            # used to end here), counted; the socket rests ACCEPT_RETRY_S (`begin_turn` takes it back)
            self._count(RejectReason.ACCEPT_FAILED)
            if self.accept_rest_until == 0.0:
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(self.sock)
            self.accept_rest_until = time.monotonic() + ACCEPT_RETRY_S
            return
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(SO_PEERCRED_FMT))
        _pid, uid, _gid = struct.unpack(SO_PEERCRED_FMT, cred)
        refusal = None
        if uid != 0:
            refusal = f"permission denied: the MRC control socket is root-only (uid {uid})"
        elif len(self.clients) + len(self.lingering) >= MAX_CLIENTS:
            self._count(RejectReason.TOO_MANY_CLIENTS)
            refusal = (f"mrcd serves {MAX_CLIENTS} control connections, the most it takes: close some (each "
                       f"client needs one connection)")
        if refusal is not None:
            conn.setblocking(False)
            with contextlib.suppress(OSError):
                conn.send((json.dumps({"id": 0, "error": refusal}) + "\n").encode())
            conn.close()
            return
        conn.setblocking(False)
        self.attach(conn, uid)

    def begin_turn(self) -> None:
        """A new loop turn: a fresh line budget, spent first on the clients the last turn left waiting;
        the listening socket back after its rest."""
        self.budget = MAX_LINES_PER_TURN
        if self.accept_rest_until and time.monotonic() >= self.accept_rest_until and self.sock is not None:
            self.accept_rest_until = 0.0
            self.sel.register(self.sock, selectors.EVENT_READ, self)
        for key, c in list(self.backlog.items()):
            if self.budget <= 0:
                break
            self._answer_lines(c)
            if self.backlog.pop(key, None) is not None:  # lines left: to the back of the line
                self.backlog[key] = c

    @property
    def busy(self) -> bool:
        """Complete request lines are waiting for the next turn's budget: the loop should not sleep."""
        return bool(self.backlog)

    def attach(self, conn: socket.socket, uid: int) -> Client:
        """Serve an accepted, non-blocking connection: greet it and watch it."""
        c = Client(conn, uid)
        self.clients[conn.fileno()] = c
        self.sel.register(conn, selectors.EVENT_READ, c)
        push(c, {"id": 0, "ok": self.handler.greeting()})
        return c

    def on_io(self, c: Client, mask: int) -> None:
        if mask & selectors.EVENT_WRITE:  # only while paused: it is registered for nothing else then
            self._flush_client(c)
            return
        if mask & selectors.EVENT_READ:
            if c.sock.fileno() in self.backlog:
                return  # its complete lines first (bounds rbuf); the budget serves it next turn
            try:
                data, anc, flags, _a = c.sock.recvmsg(1 << 20, socket.CMSG_SPACE(MAX_PENDING_FDS * 4))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
                anc = []
                flags = 0
            if flags & socket.MSG_CTRUNC:  # more descriptors than the buffer holds: the kernel closed them
                self._count(RejectReason.TOO_MANY_FDS)
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(value[: len(value) - len(value) % a.itemsize])
                    for fd in a:
                        if len(c.fds) < MAX_PENDING_FDS:
                            c.fds.append(fd)
                            continue
                        with contextlib.suppress(OSError):
                            os.close(fd)
                        self._count(RejectReason.TOO_MANY_FDS)
            if not data:
                self.drop(c)
                return
            self.feed(c, data)

    def feed(self, c: Client, data: bytes) -> None:
        """Bytes read from `c`: answer every complete line; an over-long line is refused once and its
        tail skipped."""
        c.rbuf += data
        self._answer_lines(c)

    def _answer_lines(self, c: Client) -> None:
        """Answer the complete lines in `c.rbuf`, in order, until none is left, the client's queued
        replies pass MAX_QUEUED_REPLY_BYTES (then the rest wait, unread, until it catches up) or the
        turn's budget or the client's share of it is spent (then it waits in `backlog`)."""
        key = c.sock.fileno()
        quota = MAX_LINES_PER_CLIENT
        while True:
            if len(c.wbuf) > self._reply_cap():
                # waiting for it to read, not for a budget: out of the backlog, or the loop would spin
                # without sleeping until it reads (unpausing answers its lines again)
                self.backlog.pop(key, None)
                if not c.paused:
                    c.paused = True
                    self.paused_total += 1
                    self.sel.modify(c.sock, selectors.EVENT_WRITE, c)
                return
            i = c.rbuf.find(b"\n")
            if i >= 0 and (self.budget <= 0 or quota <= 0):
                self.backlog[key] = c
                return
            if i < 0:
                self.backlog.pop(key, None)
                if len(c.rbuf) > MAX_REQUEST_BYTES and not c.skipping:
                    self.reject(c, None, RequestRejected(
                        RejectReason.TOO_LONG, f"bad request: longer than {MAX_REQUEST_BYTES} bytes"))
                    c.skipping = True
                if c.skipping:
                    c.rbuf.clear()
                break
            line = bytes(c.rbuf[:i])
            del c.rbuf[: i + 1]
            if c.skipping:  # the tail of a line already refused
                c.skipping = False
                continue
            self.budget -= 1
            quota -= 1
            self.request(c, line)
            if c.sock.fileno() < 0:
                self.backlog.pop(key, None)
                return

    def _reply_cap(self) -> int:
        """The unread reply bytes past which a client is paused: its own limit, or the floor while all
        clients together hold more than MAX_TOTAL_QUEUED_REPLY_BYTES."""
        return REPLY_FLOOR_BYTES if self.queued > MAX_TOTAL_QUEUED_REPLY_BYTES else MAX_QUEUED_REPLY_BYTES

    def flush(self) -> None:
        """Send what every client has queued, as far as its socket takes it now; close the lingering
        clients whose replies are out or whose time is up; count what stays queued."""
        queued = 0
        for c in list(self.clients.values()):
            if c.wbuf:
                self._flush_client(c)
                queued += len(c.wbuf)
        if self.lingering:
            now = time.monotonic()
            for c in list(self.lingering.values()):
                if not c.wbuf or now >= c.closing_at:
                    self._close(c)
                else:
                    queued += len(c.wbuf)
        self.queued = queued

    def _flush_client(self, c: Client) -> None:
        try:
            n = c.sock.send(c.wbuf)
            del c.wbuf[:n]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            # the peer stopped reading (e.g. a one-line link_status sender): what it sent is still read
            # and handled; the read side sees its EOF and drops it
            c.wbuf.clear()
        if c.closing_at:
            if not c.wbuf:
                self._close(c)
            return
        if c.paused and len(c.wbuf) <= self._reply_cap() // 4 and c.sock.fileno() >= 0:
            c.paused = False
            self.sel.modify(c.sock, selectors.EVENT_READ, c)
            self._answer_lines(c)  # the lines read before the pause first

    def drop(self, c: Client) -> None:
        """The client is gone (EOF, error, mrcd stopping): what it owned is released now; replies still
        queued go out in the background for up to LINGER_S (a client that half-closes after its last
        request still reads its answers), and the loop never waits for them."""
        key = c.sock.fileno()
        if key >= 0 and not c.closing_at:
            self.clients.pop(key, None)
            self.backlog.pop(key, None)
            c.rbuf.clear()
            c.closing_at = time.monotonic() + LINGER_S
            self.lingering[key] = c
            self._flush_client(c)  # closes it once everything went out: most replies fit at once
            if c.sock.fileno() >= 0:
                self.sel.modify(c.sock, selectors.EVENT_WRITE, c)
        self.handler.client_gone(c)
        while c.fds:
            with contextlib.suppress(OSError):
                os.close(c.fds.popleft())

    def _close(self, c: Client) -> None:
        key = c.sock.fileno()
        if key >= 0:
            self.lingering.pop(key, None)
            with contextlib.suppress(KeyError, ValueError):
                self.sel.unregister(c.sock)
            c.sock.close()
        c.wbuf.clear()

    def reject(self, c: Client, rid: Any, e: ProtocolError) -> None:
        self.rejected[e.reason] = self.rejected.get(e.reason, 0) + 1
        push(c, {"id": rid, "error": str(e), "kind": str(e.kind)})

    def request(self, c: Client, line: bytes) -> None:
        """Answer one request line with exactly one reply; nothing a client sends ends the loop.

        The request is checked against the shared schema (`mrc.dataplane.protocol`) before dispatch, so
        that whatever the handler raises afterwards is either its refusal (MrcError / ValueError:
        `refused`) or a bug (anything else: `internal`, logged) -- never the client's bad request."""
        try:
            req = parse_request(line)
        except RequestRejected as e:
            self.reject(c, None, e)
            return
        rid = req.get("id")
        if not isinstance(rid, (int, str)) or isinstance(rid, bool):
            rid = None
        op = req["op"]
        try:
            validate_request(req)
        except ProtocolError as e:
            spec = OPS.get(op) if isinstance(op, str) else None
            if spec is not None and spec.fds and c.fds:
                # the descriptor sent with this refused request goes with it: left pending, the
                # client's next reg_mr would register this one instead of its own
                with contextlib.suppress(OSError):
                    os.close(c.fds.popleft())
            self.reject(c, rid, e)
            return
        fn = self.handler.operation(op)
        try:
            res = fn(c, req)
        except ProtocolError as e:  # a handler's own protocol check (hello's version)
            self.reject(c, rid, e)
        except QueueFull as e:  # ENOMEM of a post: refused, and worth retrying once completions come
            self.reject(c, rid, ProtocolError(ErrorKind.REFUSED, RejectReason.QUEUE_FULL, str(e)))
        except (MrcError, ValueError) as e:  # a valid request the operation declines
            self.reject(c, rid, ProtocolError(ErrorKind.REFUSED, RejectReason.INVALID, str(e)))
        except Exception as e:  # a handler bug: one error reply, logged, the loop goes on
            print(f"mrcd: internal error in op {op}: {type(e).__name__}: {e}\n{traceback.format_exc()}",
                  file=self.log or sys.stderr, end="")
            self.reject(c, rid, ProtocolError(ErrorKind.INTERNAL, RejectReason.INTERNAL,
                                              f"internal error in op {op} (mrcd logged it)"))
        else:
            push(c, {"id": rid, "ok": res})
