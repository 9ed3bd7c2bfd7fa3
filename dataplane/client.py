"""The MRC client library: how an application (bench, all-reduce rank) uses MRC on a host where `mrcd` runs.

The engine runs inside `mrcd` (one per host, docs/daemon.md). An application talks to it over the
host's control socket (``/run/mrc/<host>.sock``, root-only) with one JSON object per line; memory
regions are shared memory (a memfd the application creates, maps, and passes to mrcd with SCM_RIGHTS),
so payload bytes never cross the socket: mrcd's engine reads and places them in the same pages the
application sees. Opening a QP to a peer host::

    with MrcClient.for_host("h0") as c:                   # /run/mrc/<host>.sock
        mr = c.reg_mr(64 << 20)                           # mr.buf: a writable mmap shared with mrcd
        qp = c.create_qp("h2")                            # QPN unique on this host
        ... exchange (qp.qpn, mr.addr, mr.rkey) with the peer application out of band ...
        c.connect(qp, peer_qpn)
        c.post_send(qp, wr_id=1, mr=mr, offset=0, length=n, remote_addr=raddr, rkey=rkey, imm=7)
        wc = c.wait_wc(qp, wr_id=1)                       # completions are pushed by mrcd

Errors from mrcd come back as `ProtocolError` (an `MrcError`) with mrcd's one-line message and its
`kind` (bad_request, unknown_field, refused, internal). Every request is checked against the shared
schema (`mrc.dataplane.protocol`) before it is sent, so a misspelt field fails here, with the op's field
list, instead of being silently ignored by mrcd.
"""

from __future__ import annotations

import array
import contextlib
import errno
import json
import mmap
import os
import select
import socket
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from mrc.errors import MrcError
from mrc.hostconfig import MAX_SOCKET_PATH

from . import shm
from .protocol import (
    OPS,
    PROTOCOL_VERSION,
    ErrorKind,
    ProtocolError,
    check_response,
    check_version,
    encode_request,
    validate_request,
)

#: The longest line the client reads from mrcd (mrcd bounds its largest answer, `actions`, well below it).
MAX_LINE: Final = 1 << 24
#: Requests sent without waiting for their answers (`wait=False`) that may be unanswered at once; one
#: more first reads answers until there is room, so neither side's buffers grow with a fast poster.
MAX_UNANSWERED: Final = 256
#: How often a connect to an mrcd whose listen backlog is full is tried again (within the timeout).
CONNECT_RETRY_S: Final = 0.01


def socket_dir() -> Path:
    return Path(os.environ.get("MRC_RUN_DIR", "/run/mrc"))


def socket_path(host: str) -> Path:
    """The control socket of host `host` (on a testbed: the host's namespace name, e.g. mrc-h0)."""
    return socket_dir() / f"{host}.sock"


def check_socket_path(path: str | Path, name: str | None = None) -> Path:
    """`path`, if a unix socket can have it (sun_path: MAX_SOCKET_PATH bytes and the NUL). A longer one
    fails in connect/bind with an OSError without errno ("AF_UNIX path too long"), which reads as
    "Input/output error": refused here instead, naming the path, or `name`, the variable it came from."""
    n = len(os.fsencode(path))
    if n <= MAX_SOCKET_PATH:
        return Path(path)
    limit = f"a unix socket path holds at most {MAX_SOCKET_PATH}"
    raise MrcError(f"{name} path is {n} bytes; {limit}: {path}" if name else f"{path}: {n} bytes; {limit}")


@dataclass
class RemoteMr:
    """A memory region registered with mrcd: `buf` is this process's view of the shared pages."""

    handle: int
    rkey: int
    addr: int
    length: int
    buf: mmap.mmap
    fd: int

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # a numpy view still holds it: the pages go with the process
            self.buf.close()
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(frozen=True)
class ClientQp:
    qpn: int
    peer: str
    gid: str
    mtu: int | None = None  # its payload per packet (None from an mrcd before protocol 1.1)


def _connect(path: Path, timeout: float) -> socket.socket:
    """A connected socket to mrcd's control socket. A listener whose backlog is full answers EAGAIN at
    once (AF_UNIX has no connect in progress, and a socket with a timeout is non-blocking inside): that is
    retried until `timeout`, so a busy mrcd is waited for and a stopped one is told as such."""
    check_socket_path(path)
    deadline = time.monotonic() + timeout
    while True:
        sk = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sk.settimeout(timeout)
        try:
            sk.connect(str(path))
            return sk
        except PermissionError:
            sk.close()
            raise MrcError(f"{path}: permission denied: the MRC control socket is root-only "
                           f"(uid {os.geteuid()})") from None
        except (FileNotFoundError, ConnectionRefusedError):
            sk.close()
            raise MrcError(f"{path}: no mrcd is listening "
                           "(start it, or 'mrcctl testbed up --with-daemons')") from None
        except BlockingIOError:
            sk.close()
            if time.monotonic() >= deadline:
                raise MrcError(f"{path}: mrcd accepted no connection within {timeout:g} s (its listen "
                               "backlog is full: is it stopped or stuck?)") from None
            time.sleep(CONNECT_RETRY_S)
        except OSError as e:
            sk.close()
            raise MrcError(f"{path}: {os.strerror(e.errno or errno.EIO)}") from None


def _bad_reply(path: Path, problem: str) -> ProtocolError:
    """A line from mrcd that is no reply at all (not JSON, not an object, an id that is no id): an mrcd
    speaking another protocol, or something else on the socket. Raised as the client's protocol error,
    not as a JSON or attribute traceback (mrcctl prints it as one error line)."""
    return ProtocolError(ErrorKind.INTERNAL, "bad_reply",
                         f"{path}: mrcd sent a line that is not a reply: {problem}")


def _parse_reply(path: Path, line: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(line)
    except RecursionError:
        raise _bad_reply(path, "nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise _bad_reply(path, f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise _bad_reply(path, f"JSON {type(doc).__name__}, not an object")
    rid = doc.get("id")
    if rid is not None and (not isinstance(rid, (int, str)) or isinstance(rid, bool)):
        raise _bad_reply(path, f"its id is {type(rid).__name__}, not an integer, a string or null")
    if "error" not in doc and "ok" not in doc and "push" not in doc:
        raise _bad_reply(path, "an object without ok, error or push")
    return doc


def _remote_error(doc: dict[str, Any]) -> ProtocolError:
    """mrcd's error reply as an exception; an mrcd from before error kinds sends none: `refused`."""
    try:
        kind = ErrorKind(doc.get("kind", ErrorKind.REFUSED))
    except ValueError:
        kind = ErrorKind.REFUSED
    return ProtocolError(kind, str(kind), str(doc["error"]))


def _idless_error(doc: dict[str, Any]) -> bool:
    return doc.get("id") is None and "error" in doc


class MrcClient:
    """One connection to one host's mrcd. Not thread-safe: one thread per client."""

    def __init__(self, path: str | Path, *, timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.timeout = timeout
        self.sk = _connect(self.path, timeout)
        self._rbuf = bytearray()
        self._id = 0
        self.pushes: deque[dict[str, Any]] = deque()
        self._wcs: dict[int, deque[dict[str, Any]]] = {}
        # requests sent with wait=False whose answers have not been read: id -> op (in sending order)
        self._unanswered: dict[int, str] = {}
        self._deferred: ProtocolError | None = None  # the first error answer to one of them, not raised yet
        self.mrs: list[RemoteMr] = []
        # mrcd speaks first: a greeting, or the reason it refuses us (before we send anything, so that
        # its closing the connection cannot reset the line away)
        try:
            first = self._read_line(timeout)
        except (OSError, ValueError, ProtocolError) as e:
            self.sk.close()
            raise MrcError(f"{self.path}: no greeting from mrcd: {e}") from None
        if first is None or "error" in first:
            self.sk.close()
            raise MrcError(str(first["error"]) if first else f"{self.path}: no greeting from mrcd")
        try:
            hello = self.call("hello", protocol=PROTOCOL_VERSION)
            if hello.get("protocol") is not None:  # an mrcd from before the versioned protocol sends none
                check_version(str(hello["protocol"]), side="mrcd")
        except MrcError:
            self.sk.close()
            raise
        self.host: str = hello["host"]
        self.gid: str = hello["gid"]
        self.info = hello

    @classmethod
    def for_host(cls, host: str, **kw: Any) -> MrcClient:
        return cls(socket_path(host), **kw)

    # -- wire
    def _send(self, doc: dict[str, Any], fds: list[int] | None = None) -> None:
        data = encode_request(doc)  # ProtocolError when mrcd would refuse it for its length
        if fds:
            self.sk.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
        else:
            self.sk.sendall(data)

    def _read_line(self, timeout: float | None) -> dict[str, Any] | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            i = self._rbuf.find(b"\n")
            if i >= 0:
                line = bytes(self._rbuf[:i])
                del self._rbuf[: i + 1]
                return _parse_reply(self.path, line)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return None
            r, _, _ = select.select([self.sk], [], [], left)
            if not r:
                return None
            chunk = self.sk.recv(1 << 20)
            if not chunk:
                raise MrcError(f"{self.path}: mrcd closed the connection")
            self._rbuf += chunk
            if len(self._rbuf) > MAX_LINE:
                raise MrcError(f"{self.path}: oversized message from mrcd")

    def _dispatch_push(self, doc: dict[str, Any]) -> None:
        if doc.get("push") == "wc":
            qpn = doc.get("qpn")
            if not isinstance(qpn, int) or isinstance(qpn, bool):
                raise _bad_reply(self.path, f"a work completion whose qpn is {type(qpn).__name__}")
            self._wcs.setdefault(qpn, deque()).append(doc)
        else:
            self.pushes.append(doc)

    def _route(self, doc: dict[str, Any]) -> bool:
        """Take a line that is not the answer being waited for: a push, or the answer to a request sent
        without waiting (an error one is kept for `_raise_deferred`). False for anything else."""
        if "push" in doc:
            self._dispatch_push(doc)
            return True
        rid = doc.get("id")
        if rid is None and "error" in doc and self._unanswered:
            # mrcd refuses a line it could not read as a request (not JSON, too long) with id null; it
            # answers in order, so that is the oldest request still unanswered
            rid = next(iter(self._unanswered))
        op = self._unanswered.pop(rid, None)  # type: ignore[arg-type]
        if op is None:
            return False
        err: ProtocolError | None = None
        if "error" in doc:
            err = _remote_error(doc)
        else:
            try:
                check_response(op, doc.get("ok"))
            except ProtocolError as e:
                err = e
        if err is not None and self._deferred is None:
            self._deferred = ProtocolError(err.kind, err.reason,
                                           f"{op} (request {rid}, sent without waiting): {err}")
        return True

    def _raise_deferred(self) -> None:
        """Raise the error answer to an earlier request sent without waiting, once."""
        err, self._deferred = self._deferred, None
        if err is not None:
            raise err

    def _request(self, op: str, fds: list[int] | None, args: dict[str, Any]) -> int:
        """Validate and send one request; its id. A refusal that closed the connection is raised."""
        req = {"op": op, **args}
        validate_request(req)
        if OPS[op].fds and not fds:
            raise ProtocolError(ErrorKind.BAD_REQUEST, "bad_field", f"{op}: needs a file descriptor")
        self._raise_deferred()
        self._id += 1
        rid = self._id
        try:
            self._send({"id": rid, **req}, fds)
        except ProtocolError:  # longer than mrcd reads (`encode_request`): nothing went out
            self._id -= 1
            raise
        except (BrokenPipeError, ConnectionResetError):
            # mrcd refused us and closed: its one line says why
            try:
                doc = self._read_line(1.0)
            except (MrcError, OSError, ValueError):
                doc = None
            if doc is not None and "error" in doc:
                raise _remote_error(doc) from None
            raise MrcError(f"{self.path}: mrcd closed the connection") from None
        return rid

    def call(self, op: str, fds: list[int] | None = None, **args: Any) -> Any:
        """One request; returns mrcd's answer, raises MrcError with its error line.

        The request is validated locally first (`ProtocolError`, nothing sent) and the answer's shape
        checked against the op's response, with the same schema mrcd uses. An error answer to an earlier
        request sent without waiting (`call_nowait`) is raised first, instead."""
        rid = self._request(op, fds, args)
        deadline = time.monotonic() + self.timeout
        while True:
            doc = self._read_line(max(0.0, deadline - time.monotonic()))
            if doc is None:
                raise MrcError(f"{self.path}: mrcd did not answer {op!r} within {self.timeout} s")
            ours = doc.get("id") == rid or (_idless_error(doc) and not self._unanswered)
            if "push" in doc or not ours:
                # a push, an answer to an earlier request sent without waiting (they come first: mrcd
                # answers in order; an id-less error is the oldest one's), or a stray line
                self._route(doc)
                continue
            self._raise_deferred()
            if "error" in doc:
                # ours, also with id null: mrcd could not read our line as a request, and this client has
                # one request outstanding when nothing sent without waiting is (waiting out the timeout
                # for an answer that cannot come told nothing)
                raise _remote_error(doc)
            ok = doc.get("ok")
            check_response(op, ok)
            return ok

    def call_nowait(self, op: str, **args: Any) -> None:
        """One request without waiting for its answer (mrcd answers requests in order; the answer is read
        by a later call, `poll_wc` or `sync`). An error answer is raised by the next of those, naming the
        op. For the data path's post_send / post_recv, whose answers carry nothing: a rank posting a
        message then pays one socket write, not a round trip through a busy mrcd's loop. At most
        MAX_UNANSWERED are outstanding."""
        while len(self._unanswered) >= MAX_UNANSWERED:
            self._read_answers(len(self._unanswered) - MAX_UNANSWERED + 1)
        rid = self._request(op, None, args)
        self._unanswered[rid] = op

    def _read_answers(self, count: int) -> None:
        """Read lines until `count` more requests sent without waiting were answered."""
        target = len(self._unanswered) - count
        deadline = time.monotonic() + self.timeout
        while len(self._unanswered) > max(target, 0):
            doc = self._read_line(max(0.0, deadline - time.monotonic()))
            if doc is None:
                first = next(iter(self._unanswered.values()))
                raise MrcError(f"{self.path}: mrcd did not answer {first!r} within {self.timeout} s")
            self._route(doc)

    def sync(self) -> None:
        """Wait for the answers to every request sent without waiting; raise the first error among them."""
        self._read_answers(len(self._unanswered))
        self._raise_deferred()

    # -- verbs
    def reg_mr(self, length: int) -> RemoteMr:
        """A shared-memory region of `length` bytes registered with mrcd (remote write allowed)."""
        fd, buf = shm.create("mrc-mr", length)  # sealed: mrcd refuses a memfd we could still shrink
        try:
            r = self.call("reg_mr", fds=[fd], length=length)
        except BaseException:
            os.close(fd)
            raise
        mr = RemoteMr(int(r["handle"]), int(r["rkey"]), int(r["addr"]), length, buf, fd)
        self.mrs.append(mr)
        return mr

    def create_qp(self, peer: str, *, evs: int | None = None, planes: list[int] | None = None,
                  cc: str = "nscc") -> ClientQp:
        """A QP toward host `peer`; `evs` / `planes` restrict its EV profile (e.g. 1 EV on plane 0: the
        single-path baseline)."""
        r = self.call("create_qp", peer=peer, evs=evs, planes=planes, cc=cc)
        mtu = r.get("mtu")
        return ClientQp(int(r["qpn"]), peer, str(r["peer_gid"]), None if mtu is None else int(mtu))

    def connect(self, qp: ClientQp, peer_qpn: int, peer_mtu: int | None = None) -> None:
        """Connect `qp` to the peer's QP `peer_qpn`; `peer_mtu`, that QP's payload per packet (its
        `ClientQp.mtu`, exchanged with the QPN), caps ours, so hosts whose ports take different MTUs
        still agree. Left out of the request when None (an mrcd before protocol 1.1 refuses it)."""
        if peer_mtu is None:
            self.call("connect", qpn=qp.qpn, peer_qpn=peer_qpn)
        else:
            self.call("connect", qpn=qp.qpn, peer_qpn=peer_qpn, mtu=peer_mtu)

    def destroy_qp(self, qp: ClientQp) -> None:
        self.call("destroy_qp", qpn=qp.qpn)

    def post_send(self, qp: ClientQp, *, wr_id: int, mr: RemoteMr, offset: int, length: int, remote_addr: int,
                  rkey: int, imm: int | None = None, wait: bool = True) -> None:
        """Post an RDMA WRITE; `wait=False` sends the request without waiting for mrcd's answer
        (`call_nowait`): a refusal is then raised by a later call, the completion comes as a WC either way."""
        (self.call if wait else self.call_nowait)(
            "post_send", qpn=qp.qpn, wr_id=wr_id, mr=mr.handle, offset=offset, length=length,
            remote_addr=remote_addr, rkey=rkey, imm=imm)

    def post_recv(self, qp: ClientQp, wr_id: int, wait: bool = True) -> None:
        """Post a receive; `wait=False` as for post_send."""
        (self.call if wait else self.call_nowait)("post_recv", qpn=qp.qpn, wr_id=wr_id)

    def poll_wc(self, qp: ClientQp, timeout: float = 0.0) -> list[dict[str, Any]]:
        """Completions of `qp` pushed by mrcd so far (waiting up to `timeout` for the first). Raises the
        error answer to an earlier request sent without waiting, if one came (the completions stay)."""
        q = self._wcs.setdefault(qp.qpn, deque())
        deadline = time.monotonic() + timeout
        self._raise_deferred()
        while not q:
            left = deadline - time.monotonic()
            doc = self._read_line(max(0.0, left))
            if doc is None:
                break
            self._route(doc)
            self._raise_deferred()
            if left <= 0:
                break
        out = list(q)
        q.clear()
        return out

    def wait_wc(self, qp: ClientQp, wr_id: int, timeout: float = 600.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            for wc in self.poll_wc(qp, timeout=min(0.5, max(0.0, deadline - time.monotonic()))):
                if int(wc["wr_id"]) == wr_id:
                    if wc["status"] != "SUCCESS":
                        raise MrcError(f"QP {qp.qpn}: work request {wr_id} failed: {wc['status']}")
                    return wc
            if time.monotonic() > deadline:
                raise MrcError(f"QP {qp.qpn}: no completion for work request {wr_id} in {timeout} s")

    def close(self) -> None:
        for mr in self.mrs:
            mr.close()
        self.mrs.clear()
        self.sk.close()

    def __enter__(self) -> MrcClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
