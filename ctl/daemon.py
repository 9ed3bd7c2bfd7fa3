"""`mrcd`: the MRC controller of one host (docs/design.md §7, docs/daemon.md).

One per host (on a testbed: one per host namespace, started by ``mrcctl testbed up --with-daemons``).
It runs the host's engine (`mrc.transport.Context`) on the host's MRC socket (`SocketDriver`), and:

* computes the host's paths from the topology: EV index i toward peer P is plane ``i mod planes``,
  ``(i div planes)``-th path of that plane; fills one EXP EV profile per peer and the host egress path
  map with exactly that table;
* keeps the ingress allowed-QP map in step with its QPs;
* consumes the EV events of every QP, correlates ASSUMED_BAD EVs across QPs and peers to a failed link
  (`Controller`), DENYs every EV through it (a host access link: the port is disabled and peers get
  PORT_STATUS), probes the denied link through one EV and restores it when the probes answer;
* serves the control socket (``$MRC_RUN_DIR/<host>.sock``, mode 0600, root only: other users are
  refused with a clear error) for applications (client library `mrc.dataplane.client`) and `mrcctl`;
* exports Prometheus metrics (`mrc.ctl.metrics`) on ``--metrics ADDR:PORT``.

SIGTERM / SIGINT end it cleanly: its path-map and allowed-QP entries are removed, the socket unlinked.
A SIGKILLed mrcd leaves map entries only; ``mrcctl prog detach --all`` removes them with the programs.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import errno
import ipaddress
import json
import mmap
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from mrc import __version__ as mrc_version
from mrc.dataplane import abi, netns
from mrc.dataplane import testbed as tbmod
from mrc.dataplane.client import socket_path
from mrc.dataplane.driver import SocketDriver, wait
from mrc.dataplane.fabric import FabricDataplane, ct_u32
from mrc.dataplane.protocol import PROTOCOL_VERSION, ErrorKind, ProtocolError, check_version, validate_request
from mrc.dataplane.udp import mrc_socket
from mrc.errors import MrcError
from mrc.topology import Path as TopoPath
from mrc.transport import (
    Context,
    EvEntry,
    EvMode,
    EvProfile,
    EvState,
    MemoryRegion,
    NsccConfig,
    QpAttr,
    QueuePair,
    WorkCompletion,
)

from .controller import (
    Action,
    Allow,
    Controller,
    Deny,
    Effect,
    Link,
    ModifyPort,
    QpSample,
    Routes,
    SetEvState,
    SetPath,
    TellPeer,
    link_name,
)
from .metrics import MetricsServer

DEFAULT_EVS: Final = 64
SO_PEERCRED_FMT: Final = "3i"
CTRL_PERIOD_NS: Final = 2_000_000  # controller pass at most every 2 ms
#: how long a `link_status` line to a peer mrcd is retried (its listen backlog full) before it is dropped
PEER_NOTE_NS: Final = 1_000_000_000
#: The longest control-socket request line; a longer one is answered with an error and skipped.
MAX_REQUEST_BYTES: Final = 1 << 16


class RequestRejected(ProtocolError):
    """A control-socket line that is not a request at all (too long, not JSON, not an object, no string
    `op`): always `bad_request` to the client; `reason` keys the rejection counter."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(ErrorKind.BAD_REQUEST, reason, message)


def _no_constants(name: str) -> Any:
    raise RequestRejected("bad_json", f"bad request: {name} is not a JSON number")


def parse_request(line: bytes) -> dict[str, Any]:
    """One request line -> its object, or RequestRejected: JSON (no NaN/Infinity, nesting within the
    parser's limits), an object, with a string `op`."""
    if len(line) > MAX_REQUEST_BYTES:
        raise RequestRejected("too_long", f"bad request: longer than {MAX_REQUEST_BYTES} bytes")
    try:
        req = json.loads(line, parse_constant=_no_constants)
    except RecursionError:
        raise RequestRejected("bad_json", "bad request: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise RequestRejected("bad_json", f"bad request: not JSON ({e})") from None
    if not isinstance(req, dict):
        raise RequestRejected("not_object", "bad request: a request is a JSON object")
    if not isinstance(req.get("op"), str):
        raise RequestRejected("bad_op", "bad request: 'op' must be a string")
    return req

@dataclass
class PeerTable:
    """One peer: its address, its EXP EV profile, and the controller's path table toward it (`routes`,
    read here; only the controller's effects change it)."""

    peer: str
    gid: bytes
    profile: EvProfile
    routes: Routes

    @property
    def paths(self) -> list[TopoPath]:
        return self.routes.paths

    @property
    def by_link(self) -> dict[Link, list[int]]:
        return self.routes.by_link


@dataclass
class Client:
    sock: socket.socket
    uid: int
    rbuf: bytearray = field(default_factory=bytearray)
    fds: deque[int] = field(default_factory=deque)
    qps: set[int] = field(default_factory=set)
    mrs: dict[int, tuple[MemoryRegion, mmap.mmap]] = field(default_factory=dict)
    wbuf: bytearray = field(default_factory=bytearray)
    skipping: bool = False  # discarding the rest of an over-long line


@dataclass
class PeerNote:
    """One line on its way to one peer mrcd's control socket (`PeerNotifier`)."""

    path: str
    data: bytes
    deadline: int
    sock: socket.socket | None = None
    connected: bool = False


class PeerNotifier:
    """Lines to peer mrcds (the controller's `TellPeer`) on non-blocking AF_UNIX sockets in mrcd's
    selector, so that no peer can hold up mrcd's loop: `send` only queues; `pump` connects without
    blocking (a peer whose listen backlog is full, EAGAIN, is retried on later turns); a connected note
    is written when the selector reports it writable (`on_writable`) and closed once sent. A peer whose
    socket is missing or refuses, or that stays unreachable for `patience_ns`, is dropped and counted
    (`tally`: sent / dropped, in mrcd's `stats` as peer_notes)."""

    def __init__(self, sel: selectors.BaseSelector, *, patience_ns: int = PEER_NOTE_NS) -> None:
        self.sel = sel
        self.patience_ns = patience_ns
        self.pending: list[PeerNote] = []  # not connected yet
        self.tally: dict[str, int] = {"sent": 0, "dropped": 0}

    def send(self, path: str, data: bytes, now: int) -> None:
        self.pending.append(PeerNote(path, data, now + self.patience_ns))

    def pump(self, now: int) -> None:
        """Try to connect every pending note once (never blocks)."""
        keep: list[PeerNote] = []
        for n in self.pending:
            if n.sock is None:
                n.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                n.sock.setblocking(False)
            err = n.sock.connect_ex(n.path)
            if err in (0, errno.EISCONN):
                n.connected = True
                self.sel.register(n.sock, selectors.EVENT_WRITE, n)
            elif err in (errno.EAGAIN, errno.EINPROGRESS, errno.EALREADY) and now < n.deadline:
                keep.append(n)
            else:
                self._drop(n)
        self.pending = keep

    def on_writable(self, n: PeerNote, now: int) -> None:
        """The note's socket is writable: write what is left of the line; when it is all sent (or the
        peer failed), close."""
        assert n.sock is not None
        try:
            sent = n.sock.send(n.data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._drop(n)
            return
        n.data = n.data[sent:]
        if not n.data:
            self.tally["sent"] += 1
            self._close(n)
        elif now >= n.deadline:
            self._drop(n)

    def busy(self) -> bool:
        """Anything still queued or in the selector."""
        return bool(self.pending) or any(isinstance(k.data, PeerNote) for k in self.sel.get_map().values())

    def close(self) -> None:
        for n in self.pending + [k.data for k in self.sel.get_map().values() if isinstance(k.data, PeerNote)]:
            self._close(n)
        self.pending = []

    def _close(self, n: PeerNote) -> None:
        if n.sock is not None:
            if n.connected:
                with contextlib.suppress(KeyError, ValueError):
                    self.sel.unregister(n.sock)
            n.sock.close()
            n.sock = None

    def _drop(self, n: PeerNote) -> None:
        self.tally["dropped"] += 1
        self._close(n)


class _PortRx:
    """The ports' receive counters as the controller's lazy `port_rx[plane]`: each index is a read of
    host_ingress's per-CPU counters, done only when the controller asks (while it suspects a port)."""

    def __init__(self, d: Daemon) -> None:
        self.d = d

    def __getitem__(self, plane: int) -> int | None:
        return self.d.port_rx_packets(plane)


class Daemon:
    def __init__(self, testbed: str, host: str, *, evs: int = DEFAULT_EVS, socket_file: Path | None = None,
                 metrics: MetricsServer | None = None, seed: int = 0, reorder_ns: int = 2_000_000,
                 probe_timeout_ns: int = 20_000_000) -> None:
        self.tb = tbmod.Testbed.load(testbed)
        self.topo = self.tb.topo
        if host not in self.topo.host_names():
            hosts = ", ".join(self.topo.host_names())
            raise MrcError(f"testbed {testbed}: no host {host!r} (hosts: {hosts})")
        if evs < self.topo.planes:
            raise MrcError(f"--evs {evs}: need at least one EV per plane ({self.topo.planes})")
        self.host = host
        self.ns = self.tb.ns(host)
        self.evs = evs
        self.reorder_ns = reorder_ns
        self.probe_timeout_ns = probe_timeout_ns
        self.socket_file = socket_file or socket_path(self.ns)
        self.metrics = metrics
        self.started = time.time()
        self.lock = threading.Lock()
        #: time.monotonic() at the end of the loop's last turn (0.0 before the first): mrc_up and
        #: mrc_engine_loop_age_seconds say how long ago the engine last ran (ctl/metrics.py)
        self.turned = 0.0
        self.stop = False
        self.fd = FabricDataplane.open(testbed)
        if self.fd.egress is None or self.fd.ingress is None:
            raise MrcError(f"testbed {testbed}: host_egress/host_ingress not attached (mrcctl prog attach)")
        self.gid = self.topo.mrc_address(host).packed
        self.ctx = Context(self.gid, ports=self.topo.planes, seed=seed or os.getpid(), name=host)
        leaf = self.topo.host_leaf(host)
        self.port_ifname = [self.topo.link_between(host, self.topo.leaf_name(p, leaf)).a_ifname
                            for p in range(self.topo.planes)]
        self.peers: dict[str, PeerTable] = {}
        self.qp_peer: dict[int, str] = {}
        self.pinned_qps: set[int] = set()
        self.qp_owner: dict[int, Client] = {}
        self.cq = self.ctx.create_cq(1 << 20)
        self.cc_nscc = self.ctx.create_cc_profile(self._nscc())
        self.cc_null = self.ctx.create_cc_profile(None)
        self.mrs: dict[int, MemoryRegion] = {}
        # counters of destroyed QPs, so that the exported totals never go down
        self.gone: dict[str, int] = {}
        self.gone_c: dict[str, int] = {}
        self.rejected: dict[str, int] = {}  # control-socket requests refused, by reason
        self.gone_port = [0] * self.topo.planes
        self._next_mr = 1
        self.controller = Controller(self.topo, host, evs)
        self.sock: socket.socket | None = None
        self.driver: SocketDriver | None = None
        self.server: socket.socket | None = None
        self.sel = selectors.DefaultSelector()
        self.notifier = PeerNotifier(self.sel)
        self.clients: dict[int, Client] = {}
        self.hid = self.fd.ingress.allocate_id("host", f"{self.tb.name}/{host}")

    def qp_attr(self) -> QpAttr:
        """QP attributes for this testbed: an ACK timeout of 1.024 us x 2^15 = 33.6 ms, a reordering
        tolerance of `reorder_ns` and a probe timeout of `probe_timeout_ns` (the engines run in Python
        processes that share two CPUs: a SACK or a probe reply can be late by milliseconds without any
        loss; docs/daemon.md)."""
        return QpAttr(timeout=15, reorder_ns=self.reorder_ns, probe_timeout_ns=self.probe_timeout_ns)

    def _nscc(self) -> NsccConfig:
        # the testbed's fabric: per plane a link of link.rate; the host's window covers about half of the
        # plane queues' buffers together, so the queues ECN-mark but rarely drop (docs/daemon.md)
        buf = self.topo.link.buffer_bytes
        return NsccConfig.for_path(500_000, self.topo.planes * buf // 3)

    # -- paths
    def port_rx_packets(self, plane: int) -> int | None:
        """Packets that arrived on our plane port (host_ingress's per-port counters; None without them).
        Read only while an own access link is suspected (32 per-CPU map lookups)."""
        ing = self.fd.ingress
        if ing is None:
            return None
        pid = self.fd._find_id(ing, "port", self.host, self.port_ifname[plane])
        if not pid:
            return None
        m = ing.maps["mrc_ingress_ev"]
        return sum(int(m.total(ct_u32(pid * abi.EV_BUCKETS + b)).packets) for b in range(abi.EV_BUCKETS))

    def peer_table(self, peer: str) -> PeerTable:
        t = self.peers.get(peer)
        if t is not None:
            return t
        if peer not in self.topo.host_names() or peer == self.host:
            raise MrcError(f"no peer host {peer!r} (hosts: "
                           f"{', '.join(h for h in self.topo.host_names() if h != self.host)})")
        entries = [EvEntry(i, i % self.topo.planes) for i in range(self.evs)]
        prof = EvProfile(self.ctx.next_ev_profile_id(), entries, mode=EvMode.EXP)
        self.ctx.create_ev_profile(prof)
        effects = self.controller.add_peer(peer)  # its paths, and the DENY of what is already failed
        t = PeerTable(peer, self.topo.mrc_address(peer).packed, prof, self.controller.routes[peer])
        self.peers[peer] = t
        self.carry_out(effects)
        return t

    # -- lifecycle
    def start(self) -> None:
        for h in self.topo.host_names():
            if h != self.host:
                self.peer_table(h)
        self.sock = mrc_socket(self.ns, str(self.topo.mrc_address(self.host)), rcvbuf=32 << 20)
        pmap = {self.fd.ifindex(self.host, ifn): p for p, ifn in enumerate(self.port_ifname)}
        self.driver = SocketDriver(self.ctx, self.sock, pmap,
                                   port_rate_bps=[self.topo.link.rate_bps] * self.topo.planes)
        self.sel.register(self.sock, selectors.EVENT_READ, "udp")
        path = self.socket_file
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            srv.bind(str(path))
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
        srv.listen(64)
        srv.setblocking(False)
        self.server = srv
        self.sel.register(srv, selectors.EVENT_READ, "listen")
        if self.metrics is not None:
            self.metrics.start(self)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.metrics is not None:
                self.metrics.shutdown()
        for c in list(self.clients.values()):
            self._drop_client(c)
        for peer in list(self.peers):
            for i in range(self.evs):
                with contextlib.suppress(Exception):
                    self.fd.delete_path(self.host, peer, i)
        for q in list(self.qp_peer):
            self._disallow(q)
        self.notifier.close()
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(FileNotFoundError):
                self.socket_file.unlink()
        if self.sock is not None:
            self.sock.close()
        self.fd.close()

    # -- the controller's effects
    def carry_out(self, effects: list[Effect]) -> None:
        """Carry out the controller's effects, in order: engine changes and path-map writes now (the
        caller holds the engine lock); `TellPeer` only queued, to be sent by the loop on non-blocking
        sockets after the lock is released (`PeerNotifier`), so no peer delays a local DENY / REPLACE."""
        for e in effects:
            if isinstance(e, Deny):
                self.peers[e.peer].profile.deny(list(e.evs), e.time_ns)
            elif isinstance(e, Allow):
                self.peers[e.peer].profile.allow(list(e.evs), e.time_ns)
            elif isinstance(e, SetPath):
                self.fd.set_path(self.host, e.peer, e.ev, e.path)
            elif isinstance(e, SetEvState):
                qp = self.ctx.qps.get(e.qpn)
                if qp is not None:
                    qp.paths.set_state(e.ev, e.state, e.time_ns)
            elif isinstance(e, ModifyPort):
                self.ctx.modify_port(e.plane, e.enabled, e.time_ns)
            elif isinstance(e, TellPeer):
                self.tell_peers(e.link, e.state)

    def tell_peers(self, lk: Link, state: str) -> None:
        """Queue, for every other host's mrcd, the line saying that fabric link `lk` failed / returned (a
        `link_status` request on its control socket; on a real fabric this is the controllers' own
        channel). Nothing is sent here: the loop does it (`PeerNotifier.pump`) outside the engine lock."""
        msg = (json.dumps({"id": 0, "op": "link_status", "link": sorted(lk), "state": state,
                           "from": self.host}) + "\n").encode()
        now = time.monotonic_ns()
        for peer in self.topo.host_names():
            if peer != self.host:
                self.notifier.send(str(self.socket_file.parent / f"{self.tb.ns(peer)}.sock"), msg, now)

    def _allow(self, qpn: int) -> None:
        self.fd.allow_qps(self.host, [qpn])

    def _disallow(self, qpn: int) -> None:
        assert self.fd.ingress is not None
        with contextlib.suppress(Exception):
            self.fd.ingress.maps["mrc_allowed_qps"].delete(abi.QpKey(self.hid, qpn))

    # -- main loop
    def run(self, ready: Any = None) -> None:
        drv = self.driver
        assert drv is not None
        ctx = self.ctx
        ctrl = self.controller
        port_rx = _PortRx(self)
        next_ctrl = 0
        if ready is not None:
            ready()
        lock = self.lock
        while not self.stop:
            to = drv.timeout()
            if to is None or to > 0.05:
                to = 0.05
            if drv.want_write:
                to = min(to, 0.0005)
            events = wait(to, self.sel.select)
            notes_io: list[PeerNote] = []
            with lock:
                udp = False
                for key, mask in events:  # type: ignore[attr-defined]
                    tag = key.data
                    if tag == "udp":
                        udp = True
                    elif isinstance(tag, PeerNote):
                        notes_io.append(tag)
                    elif tag == "listen":
                        self._accept()
                    else:
                        self._client_io(tag, mask)
                drv.turn(udp)
                self._deliver_wcs()
                now = time.monotonic_ns()
                evs = ctx.poll_ev_events()
                if evs:
                    self.carry_out(ctrl.on_ev_events(evs))
                probes = ctx.poll_probe_results()
                if probes:
                    ctrl.on_probe_results(probes)
                if now >= next_ctrl:
                    next_ctrl = now + CTRL_PERIOD_NS
                    self.carry_out(ctrl.tick(now, port_rx, self.qp_samples()))
                    drv.flush(now)
                for c in list(self.clients.values()):
                    if c.wbuf:
                        self._flush_client(c)
                self.turned = time.monotonic()
            if notes_io or self.notifier.pending:  # peer notes: outside the engine lock, never blocking
                now = time.monotonic_ns()
                for n in notes_io:
                    self.notifier.on_writable(n, now)
                self.notifier.pump(now)

    def qp_samples(self) -> dict[int, QpSample]:
        """The controller's per-pass view of the QPs: packets sent and whether each can carry a probe."""
        qps = self.ctx.qps
        return {q: QpSample(sum(qp.paths.tx_packets), qp.state.name == "RTS")
                for q in self.qp_peer if (qp := qps.get(q)) is not None}

    def _deliver_wcs(self) -> None:
        for wc in self.cq.poll(1 << 16):
            owner = self.qp_owner.get(wc.qp_num)
            if owner is not None:
                self._push(owner, _wc_doc(wc))

    # -- control socket
    def _accept(self) -> None:
        assert self.server is not None
        try:
            conn, _ = self.server.accept()
        except (BlockingIOError, InterruptedError):
            return
        cred = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(SO_PEERCRED_FMT))
        _pid, uid, _gid = struct.unpack(SO_PEERCRED_FMT, cred)
        if uid != 0:
            with contextlib.suppress(OSError):
                conn.sendall((json.dumps({"id": 0, "error": f"permission denied: the MRC control socket is "
                                          f"root-only (uid {uid})"}) + "\n").encode())
            conn.close()
            return
        conn.setblocking(False)
        c = Client(conn, uid)
        self.clients[conn.fileno()] = c
        self.sel.register(conn, selectors.EVENT_READ, c)
        self._push(c, {"id": 0, "ok": {"mrcd": mrc_version, "host": self.host, "protocol": PROTOCOL_VERSION}})

    def _client_io(self, c: Client, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            try:
                data, anc, _f, _a = c.sock.recvmsg(1 << 20, socket.CMSG_SPACE(16 * 4))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
                anc = []
            for level, kind, value in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(value[: len(value) - len(value) % a.itemsize])
                    c.fds.extend(a)
            if not data:
                self._drop_client(c)
                return
            c.rbuf += data
            while True:
                i = c.rbuf.find(b"\n")
                if i < 0:
                    if len(c.rbuf) > MAX_REQUEST_BYTES and not c.skipping:
                        self._reject(c, None, RequestRejected(
                            "too_long", f"bad request: longer than {MAX_REQUEST_BYTES} bytes"))
                        c.skipping = True
                    if c.skipping:
                        c.rbuf.clear()
                    break
                line = bytes(c.rbuf[:i])
                del c.rbuf[: i + 1]
                if c.skipping:  # the tail of a line already refused
                    c.skipping = False
                    continue
                self._request(c, line)
                if c.sock.fileno() < 0:
                    return

    def _push(self, c: Client, doc: dict[str, Any]) -> None:
        c.wbuf += (json.dumps(doc, separators=(",", ":")) + "\n").encode()

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

    def _drop_client(self, c: Client) -> None:
        if c.sock.fileno() >= 0:
            with contextlib.suppress(Exception):
                self.sel.unregister(c.sock)
            self.clients.pop(c.sock.fileno(), None)
            with contextlib.suppress(OSError):
                c.sock.setblocking(True)
                c.sock.settimeout(1.0)
                if c.wbuf:
                    c.sock.sendall(c.wbuf)
            c.sock.close()
        for q in list(c.qps):
            self._destroy_qp(q)
        for h, (mr, mm) in list(c.mrs.items()):
            self.ctx.dereg_mr(mr)
            self.mrs.pop(h, None)
            with contextlib.suppress(BufferError):
                mm.close()
        c.mrs.clear()
        while c.fds:
            with contextlib.suppress(OSError):
                os.close(c.fds.popleft())

    def _reject(self, c: Client, rid: Any, e: ProtocolError) -> None:
        self.rejected[e.reason] = self.rejected.get(e.reason, 0) + 1
        self._push(c, {"id": rid, "error": str(e), "kind": str(e.kind)})

    def _request(self, c: Client, line: bytes) -> None:
        """Answer one request line with exactly one reply; nothing a client sends ends the loop.

        The request is checked against the shared schema (`mrc.dataplane.protocol`) before dispatch, so
        that whatever the handler raises afterwards is either its refusal (MrcError / ValueError:
        `refused`) or a bug (anything else: `internal`, logged here) -- never the client's bad request."""
        try:
            req = parse_request(line)
        except RequestRejected as e:
            self._reject(c, None, e)
            return
        rid = req.get("id")
        if not isinstance(rid, (int, str)) or isinstance(rid, bool):
            rid = None
        op = req["op"]
        try:
            validate_request(req)
        except ProtocolError as e:
            self._reject(c, rid, e)
            return
        fn = getattr(self, f"op_{op}")
        try:
            res = fn(c, req)
        except ProtocolError as e:  # a handler's own protocol check (hello's version)
            self._reject(c, rid, e)
        except (MrcError, ValueError) as e:  # a valid request the operation declines
            self._reject(c, rid, ProtocolError(ErrorKind.REFUSED, "invalid", str(e)))
        except Exception as e:  # a handler bug: one error reply, logged, the loop goes on
            print(f"mrcd: internal error in op {op}: {type(e).__name__}: {e}\n{traceback.format_exc()}",
                  file=sys.stderr, end="")
            self._reject(c, rid, ProtocolError(ErrorKind.INTERNAL, "internal",
                                               f"internal error in op {op} (mrcd logged it)"))
        else:
            self._push(c, {"id": rid, "ok": res})

    # -- operations: applications
    def op_hello(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        """mrcd's identity and protocol version; a client whose protocol major differs is refused here,
        with the versions in the message, rather than failing later on a field it reads differently."""
        if req.get("protocol") is not None:
            check_version(req["protocol"], side="client")
        return {"protocol": PROTOCOL_VERSION, "host": self.host, "testbed": self.tb.name,
                "gid": str(ipaddress.IPv6Address(self.gid)),
                "planes": self.topo.planes, "evs": self.evs, "pid": os.getpid(), "version": mrc_version,
                "peers": [h for h in self.topo.host_names() if h != self.host],
                "link_rate_bps": self.topo.link.rate_bps}

    def op_reg_mr(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        if not c.fds:
            raise MrcError("reg_mr: no file descriptor came with the request")
        fd = c.fds.popleft()
        try:
            length = int(req["length"])
            mm = mmap.mmap(fd, length)
        finally:
            os.close(fd)
        mr = self.ctx.reg_mr(mm)
        h = self._next_mr
        self._next_mr += 1
        self.mrs[h] = mr
        c.mrs[h] = (mr, mm)
        return {"handle": h, "rkey": mr.rkey, "addr": mr.addr, "length": length}

    def op_create_qp(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        peer = str(req["peer"])
        t = self.peer_table(peer)
        evs = req.get("evs")
        planes = req.get("planes")
        profile = t.profile
        pinned = False
        if evs is not None or planes is not None:
            keep_planes = set(range(self.topo.planes)) if planes is None else {int(p) for p in planes}
            bad = keep_planes - set(range(self.topo.planes))
            if bad:
                raise MrcError(f"no plane {min(bad)} (planes 0..{self.topo.planes - 1})")
            chosen = [i for i in range(self.evs) if i % self.topo.planes in keep_planes]
            if evs is not None:
                chosen = chosen[: int(evs)]
            if not chosen:
                raise MrcError("the EV restriction leaves no EV")
            profile = EvProfile(self.ctx.next_ev_profile_id(), list(t.profile.entries), mode=EvMode.EXP,
                                ev_min_active=1)
            self.ctx.create_ev_profile(profile)
            profile.deny([i for i in range(self.evs) if i not in set(chosen)])
            pinned = True
        cc = self.cc_null if req.get("cc") == "null" else self.cc_nscc
        qp = self.ctx.create_qp(self.cq, ev_profile=profile, cc_profile=cc, attr=self.qp_attr())
        self.qp_peer[qp.qpn] = peer
        self.qp_owner[qp.qpn] = c
        self.controller.add_qp(qp.qpn, peer, pinned=pinned)
        if pinned:
            self.pinned_qps.add(qp.qpn)
        c.qps.add(qp.qpn)
        self._allow(qp.qpn)
        return {"qpn": qp.qpn, "peer_gid": str(ipaddress.IPv6Address(t.gid))}

    def _qp(self, c: Client | None, req: dict[str, Any]) -> QueuePair:
        qpn = int(req["qpn"])
        qp = self.ctx.qps.get(qpn)
        if qp is None or (c is not None and qpn not in c.qps):
            raise MrcError(f"no QP {qpn} of this client")
        return qp

    def op_connect(self, c: Client, req: dict[str, Any]) -> None:
        qp = self._qp(c, req)
        qp.connect(self.peers[self.qp_peer[qp.qpn]].gid, int(req["peer_qpn"]))

    def op_destroy_qp(self, c: Client, req: dict[str, Any]) -> None:
        qp = self._qp(c, req)
        c.qps.discard(qp.qpn)
        self._destroy_qp(qp.qpn)

    def _destroy_qp(self, qpn: int) -> None:
        qp = self.ctx.qps.get(qpn)
        if qp is not None:
            for k, v in qp.c.items():
                self.gone_c[k] = self.gone_c.get(k, 0) + int(v)
            for a in ("serial", "rx_packets", "tx_bytes", "rx_bytes"):
                self.gone[a] = self.gone.get(a, 0) + int(getattr(qp, a))
            for p in range(self.topo.planes):
                self.gone_port[p] += int(qp.paths.port_bytes[p])
            self.ctx.destroy_qp(qp)
            if qpn in self.pinned_qps:  # its own restricted profile (op_create_qp): nobody else uses it
                self.ctx.destroy_ev_profile(qp.paths.profile)
        self.qp_peer.pop(qpn, None)
        self.qp_owner.pop(qpn, None)
        self.pinned_qps.discard(qpn)
        self.controller.forget_qp(qpn)
        self._disallow(qpn)

    def op_post_send(self, c: Client, req: dict[str, Any]) -> None:
        qp = self._qp(c, req)
        h = int(req["mr"])
        if h not in c.mrs:
            raise MrcError(f"no memory region {h} of this client")
        imm = req.get("imm")
        qp.post_send(int(req["wr_id"]), c.mrs[h][0], int(req["offset"]), int(req["length"]),
                     int(req["remote_addr"]), int(req["rkey"]), imm=None if imm is None else int(imm))

    def op_post_recv(self, c: Client, req: dict[str, Any]) -> None:
        self._qp(c, req).post_recv(int(req["wr_id"]))

    # -- operations: operator
    def op_qp_stats(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        qp = self._qp(None, req)
        return {"qpn": qp.qpn, "peer": self.qp_peer.get(qp.qpn), "time_ns": time.monotonic_ns(), **qp.stats()}

    def op_qp_show(self, c: Client, req: dict[str, Any]) -> list[dict[str, Any]]:
        out = []
        for qpn, qp in sorted(self.ctx.qps.items()):
            st = qp.paths.state
            out.append({"host": self.host, "qpn": qpn, "peer": self.qp_peer.get(qpn), "state": qp.state.name,
                        "peer_qpn": getattr(qp, "peer_qpn", None), "cwnd": qp.cc.cwnd, "srtt_ns": qp.srtt,
                        "inflight": qp.inflight, "data_tx": qp.serial, "data_rx": qp.rx_packets,
                        "evs": {s.name.lower(): sum(1 for x in st if x == int(s)) for s in EvState},
                        "restricted": qpn in self.pinned_qps})
        return out

    def op_ev_show(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        want = req.get("state")
        peers = {}
        for peer, t in sorted(self.peers.items()):
            qps = [q for q, p in self.qp_peer.items() if p == peer and q not in self.pinned_qps]
            rows = []
            for i, path in enumerate(t.paths):
                if i in t.profile.denied:
                    state = "DENIED"
                else:
                    states = {EvState(self.ctx.qps[q].paths.state[i]).name for q in qps if q in self.ctx.qps}
                    state = "ASSUMED_BAD" if "ASSUMED_BAD" in states else ("GOOD" if states or not qps else
                                                                            "UNKNOWN")
                    if "DENIED" in states and "ASSUMED_BAD" not in states:
                        state = "DENIED"
                if want and state.lower() != str(want).lower():
                    continue
                rows.append({"ev_index": i, "port": i % self.topo.planes, "plane": path.plane,
                             "spine": path.spine, "via": "-".join(path.hops[1:-1]), "state": state})
            peers[peer] = rows
        return {"host": self.host, "peers": peers,
                "denied_links": sorted(link_name(lk) for lk in self.controller.denied)}

    def _indices(self, req: dict[str, Any]) -> tuple[str, list[int]]:
        peer = str(req["peer"])
        t = self.peer_table(peer)
        idx: list[int] = []
        if req.get("evs"):
            idx = [int(i) for i in req["evs"]]
        if req.get("plane") is not None:
            idx += [i for i, p in enumerate(t.paths) if p.plane == int(req["plane"])]
        if req.get("link"):
            a, b = str(req["link"]).split("-", 1) if "-" in str(req["link"]) else (req["link"], "")
            idx += t.by_link.get(frozenset((a, b)), [])
        if not idx:
            raise MrcError("nothing selected: give EV indices, a plane or a link A-B")
        for i in idx:
            if not 0 <= i < self.evs:
                raise MrcError(f"EV index {i} out of range 0..{self.evs - 1}")
        return peer, sorted(set(idx))

    def op_ev_deny(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        peer, idx = self._indices(req)
        self.carry_out(self.controller.deny_manual(peer, idx, time.monotonic_ns()))
        return {"host": self.host, "peer": peer, "denied": len(idx)}

    def op_ev_restore(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        peer, idx = self._indices(req)
        self.carry_out(self.controller.restore_manual(peer, idx, time.monotonic_ns()))
        return {"host": self.host, "peer": peer, "restored": len(idx)}

    def op_port_show(self, c: Client, req: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"host": self.host, "port": p, "ifname": self.port_ifname[p],
                 "enabled": self.ctx.port_enabled[p],
                 "failed": p in self.controller.ports_down} for p in range(self.topo.planes)]

    def op_port_set(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        p = int(req["port"])
        if not 0 <= p < self.topo.planes:
            raise MrcError(f"no port {p} (ports 0..{self.topo.planes - 1})")
        enabled = bool(req["enabled"])
        self.ctx.modify_port(p, enabled, time.monotonic_ns())
        self.controller.act(Action(time.monotonic_ns(), "port_up" if enabled else "port_down",
                                   self.port_ifname[p], 0, "operator"))
        return {"host": self.host, "port": p, "enabled": enabled}

    def op_link_status(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        a, b = (str(x) for x in req["link"])
        state = str(req["state"])
        if state not in ("down", "up"):
            raise MrcError(f"link_status: state must be down or up, got {state!r}")
        res, effects = self.controller.on_link_status(frozenset((a, b)), state, str(req.get("from", "?")),
                                                      time.monotonic_ns())
        self.carry_out(effects)
        return {"host": self.host, "result": res}

    def op_actions(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        since = int(req.get("since_ns", 0))
        return {"actions": [a.to_dict() for a in self.controller.log if a.time_ns >= since],
                "events": [e for e in self.controller.events if e["time_ns"] >= since]}

    def op_stats(self, c: Client, req: dict[str, Any]) -> dict[str, Any]:
        assert self.driver is not None
        return {"host": self.host, "engine_drops": dict(self.ctx.drops), "driver": self.driver.stats(),
                "qps": len(self.ctx.qps), "controller": dict(self.controller.counts),
                "ev_events": dict(self.controller.event_counts),
                "probe_results": dict(self.controller.probe_stats),
                "peer_notes": dict(self.notifier.tally),
                "denied_links": sorted(link_name(lk) for lk in self.controller.denied),
                "dataplane": self.fd._host_stats(self.host, False)}


def _wc_doc(wc: WorkCompletion) -> dict[str, Any]:
    return {"push": "wc", "qpn": wc.qp_num, "wr_id": wc.wr_id, "status": wc.status.name,
            "opcode": wc.opcode.name, "byte_len": wc.byte_len, "imm": wc.imm_data,
            "time_ns": time.monotonic_ns()}


def _addr(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: expected ADDRESS:PORT")
    return host.strip("[]"), int(port)


def _positive_us(value: str) -> int:
    """A duration in microseconds, 1 .. 10 s."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a whole number of microseconds") from None
    if not 1 <= n <= 10_000_000:
        raise argparse.ArgumentTypeError(f"{value}: expected 1 .. 10000000 microseconds")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mrcd",
                                 description="MRC controller daemon for one host (docs/daemon.md).")
    ap.add_argument("-V", "--version", action="version", version=f"mrcd {mrc_version}")
    ap.add_argument("--testbed", default=None, help="testbed name (default: the only one up)")
    ap.add_argument("--host", required=True, help="the host this mrcd serves (e.g. h0)")
    ap.add_argument("--evs", type=int, default=DEFAULT_EVS, help="EVs per peer (split over the planes)")
    ap.add_argument("--reorder-us", type=_positive_us, default=2000,
                    help="QP reordering tolerance (microseconds)")
    ap.add_argument("--probe-timeout-us", type=_positive_us, default=20000,
                    help="a path probe without reply after this long failed (microseconds)")
    ap.add_argument("--metrics", type=_addr, default=None, metavar="ADDR:PORT", help="serve /metrics here")
    ap.add_argument("--socket", type=Path, default=None, help="control socket (default /run/mrc/<host>.sock)")
    ap.add_argument("--ready-fd", type=int, default=None, help="write 'ready\\n' to this fd when serving")
    ap.add_argument("--no-netns", action="store_true",
                    help="stay in the current network namespace (default: move into the host's after "
                         "binding the metrics address here, so 'testbed down' ends mrcd with its namespace)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("mrcd: error: needs root (CAP_NET_ADMIN, CAP_BPF)", file=sys.stderr)
        return 1
    d: Daemon | None = None

    def _stop(signum: int, _frame: Any) -> None:
        if d is not None:
            d.stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGHUP, _stop)
    metrics: MetricsServer | None = None
    try:
        name = tbmod.resolve_name(args.testbed)
        if args.metrics is not None:
            metrics = MetricsServer(*args.metrics)
        if not args.no_netns:
            netns.enter_for_exec(tbmod.Testbed.load(name).ns(args.host))
        d = Daemon(name, args.host, evs=args.evs, socket_file=args.socket, metrics=metrics,
                   reorder_ns=args.reorder_us * 1000, probe_timeout_ns=args.probe_timeout_us * 1000)
        d.start()
    except (MrcError, OSError) as e:
        print(f"mrcd: error: {e}", file=sys.stderr)
        if d is not None:
            d.close()
        elif metrics is not None:
            metrics.srv.server_close()
        return 1

    def ready() -> None:
        print(f"mrcd: {d.host} serving {d.socket_file}"
              + (f", metrics on {args.metrics[0]}:{args.metrics[1]}" if args.metrics else ""),
              file=sys.stderr)
        if args.ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(args.ready_fd, b"ready\n")
                os.close(args.ready_fd)

    try:
        d.run(ready)
    finally:
        d.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
