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

The parts, one job each: `ctl/host_engine.py` (engine, path tables, QP bookkeeping, the controller's
effects carried out; no I/O), `ctl/controller.py` (failure localisation, a pure state machine),
`ctl/control_server.py` (framing, validation, dispatch of control-socket lines), `ctl/operations.py`
(the operations), `ctl/peer_notes.py` (non-blocking notes to peer mrcds), `ctl/metrics.py` (the
exporter and the snapshot the loop publishes for it). This module binds them to a testbed host and runs
the loop.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Final

from mrc import __version__ as mrc_version
from mrc.dataplane import netns
from mrc.dataplane import testbed as tbmod
from mrc.dataplane.client import socket_path
from mrc.dataplane.driver import SocketDriver, wait
from mrc.dataplane.fabric import FabricDataplane
from mrc.dataplane.udp import mrc_socket
from mrc.errors import MrcError
from mrc.topology import Path as TopoPath
from mrc.transport import NsccConfig, QpAttr

from .control_server import Client, ControlServer
from .controller import Link
from .host_engine import DEFAULT_EVS, HostEngine
from .metrics import MetricsServer, StatsBoard, dataplane_attached, snapshot
from .operations import Operations
from .peer_notes import PeerNote, PeerNotifier, link_status_line

CTRL_PERIOD_NS: Final = 2_000_000  # controller pass at most every 2 ms
#: The loop's select timeout when nothing is due: also how stale `mrc_engine_loop_age_seconds` gets idle.
IDLE_TURN_S: Final = 0.05
#: Upper bounds of the loop-turn histogram (`stats` -> loop): how long a turn's work took, from select's
#: return to the end of the turn (peer notes included). A turn that blocks shows up here.
TURN_BUCKETS_NS: Final = (1_000_000, 2_000_000, 5_000_000, 10_000_000, 20_000_000, 50_000_000, 100_000_000,
                          1_000_000_000)


class TurnStats:
    """How long the loop's turns take (counted per turn: one clock read, one bucket search)."""

    def __init__(self) -> None:
        self.turns = 0
        self.max_ns = 0
        self.buckets = [0] * (len(TURN_BUCKETS_NS) + 1)

    def add(self, ns: int) -> None:
        self.turns += 1
        if ns > self.max_ns:
            self.max_ns = ns
        i = 0
        for b in TURN_BUCKETS_NS:
            if ns <= b:
                break
            i += 1
        self.buckets[i] += 1

    def to_dict(self) -> dict[str, Any]:
        names = [f"le_{b // 1_000_000}ms" for b in TURN_BUCKETS_NS] + ["over"]
        return {"turns": self.turns, "turn_max_ns": self.max_ns, "turn_hist": dict(zip(names, self.buckets,
                                                                                        strict=True))}


class FabricPaths:
    """The `PathWriter` of one testbed host: its entries in the host programs' path and allowed-QP maps."""

    def __init__(self, fd: FabricDataplane, host: str) -> None:
        self.fd = fd
        self.host = host

    def set_path(self, peer: str, ev: int, path: TopoPath) -> None:
        self.fd.set_path(self.host, peer, ev, path)

    def delete_path(self, peer: str, ev: int) -> None:
        with contextlib.suppress(MrcError, OSError):
            self.fd.delete_path(self.host, peer, ev)

    def allow_qp(self, qpn: int) -> None:
        self.fd.allow_qps(self.host, [qpn])

    def disallow_qp(self, qpn: int) -> None:
        with contextlib.suppress(MrcError, OSError):
            self.fd.disallow_qp(self.host, qpn)


class _PortRx:
    """The ports' receive counters as the controller's lazy `port_rx[plane]`: each index is a read of
    host_ingress's per-CPU counters, done only when the controller asks (while it suspects a port)."""

    def __init__(self, d: Daemon) -> None:
        self.d = d

    def __getitem__(self, plane: int) -> int | None:
        return self.d.fd.port_rx_packets(self.d.host, self.d.port_ifname[plane])


class Daemon:
    """mrcd on a testbed host: the `HostEngine` on the host's MRC socket (`SocketDriver`), the control
    socket (`ControlServer` + `Operations`), peer notes (`PeerNotifier`), the metrics' snapshot
    (`StatsBoard`), all in one selector loop on one thread (the metrics server's thread only waits for
    the published snapshot and reads BPF counters)."""

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
        self.planes = self.topo.planes
        self.ns = self.tb.ns(host)
        self.reorder_ns = reorder_ns
        self.probe_timeout_ns = probe_timeout_ns
        self.socket_file = socket_file or socket_path(self.ns)
        self.metrics = metrics
        self.started = time.time()
        #: time.monotonic() at the end of the loop's last turn (0.0 before the first): mrc_up and
        #: mrc_engine_loop_age_seconds say how long ago the engine last ran (ctl/metrics.py)
        self.turned = 0.0
        self.stop = False
        self.fd = FabricDataplane.open(testbed)
        if self.fd.egress is None or self.fd.ingress is None:
            raise MrcError(f"testbed {testbed}: host_egress/host_ingress not attached (mrcctl prog attach)")
        self.fd.ingress.allocate_id("host", f"{self.tb.name}/{host}")
        leaf = self.topo.host_leaf(host)
        self.port_ifname = [self.topo.link_between(host, self.topo.leaf_name(p, leaf)).a_ifname
                            for p in range(self.topo.planes)]
        self.sel = selectors.DefaultSelector()
        self.notifier = PeerNotifier(self.sel)
        self.engine = HostEngine(self.topo, host, FabricPaths(self.fd, host), self.tell_peers, evs=evs,
                                 seed=seed or os.getpid(), nscc=self._nscc(), qp_attr=self.qp_attr())
        self.ops = Operations(self.engine, site=self.tb.name, port_ifname=self.port_ifname,
                              link_rate_bps=self.topo.link.rate_bps, io_stats=self._io_stats)
        self.server = ControlServer(self.sel, self.ops)
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.sel.register(self._wake_fd, selectors.EVENT_READ, "wake")
        self.board = StatsBoard(self._wake)
        self.turn_stats = TurnStats()
        self.sock: socket.socket | None = None
        self.driver: SocketDriver | None = None

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

    # -- what the metrics read (ctl/metrics.py MetricsSource)
    def host_stats(self) -> dict[str, Any]:
        return self.fd.host_stats(self.host)

    def attached(self) -> dict[str, bool]:
        return dataplane_attached(self.fd.egress, self.fd.ingress, self.tb.name, self.host)

    def _wake(self) -> None:
        """Called from a scrape thread: make the loop's select return now."""
        with contextlib.suppress(OSError):
            os.eventfd_write(self._wake_fd, 1)

    def _io_stats(self) -> dict[str, Any]:
        assert self.driver is not None
        return {"driver": self.driver.stats(), "peer_notes": dict(self.notifier.tally),
                "loop": self.turn_stats.to_dict(), "dataplane": self.fd.host_stats(self.host)}

    # -- lifecycle
    def start(self) -> None:
        for h in self.engine.peer_names():
            self.engine.peer_table(h)
        self.sock = mrc_socket(self.ns, str(self.topo.mrc_address(self.host)), rcvbuf=32 << 20)
        pmap = {self.fd.ifindex(self.host, ifn): p for p, ifn in enumerate(self.port_ifname)}
        self.driver = SocketDriver(self.engine.ctx, self.sock, pmap,
                                   port_rate_bps=[self.topo.link.rate_bps] * self.topo.planes)
        self.sel.register(self.sock, selectors.EVENT_READ, "udp")
        self.server.listen(self.socket_file)
        if self.metrics is not None:
            self.metrics.start(self)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            if self.metrics is not None:
                self.metrics.shutdown()
        self.server.close()  # its clients' QPs and memory regions go with them
        self.engine.close()  # path-map and allowed-QP entries
        self.notifier.close()
        if self.sock is not None:
            self.sock.close()
        with contextlib.suppress(KeyError, ValueError, OSError):
            self.sel.unregister(self._wake_fd)
            os.close(self._wake_fd)
        self.fd.close()

    def tell_peers(self, lk: Link, state: str) -> None:
        """Queue, for every other host's mrcd, the line saying that fabric link `lk` failed / returned (a
        `link_status` request on its control socket; on a real fabric this is the controllers' own
        channel). Nothing is sent here: the loop does it (`PeerNotifier.pump`) after the engine's turn."""
        msg = link_status_line(lk, state, self.host)
        now = time.monotonic_ns()
        for peer in self.engine.peer_names():
            self.notifier.send(str(self.socket_file.parent / f"{self.tb.ns(peer)}.sock"), msg, now)

    # -- main loop
    def run(self, ready: Any = None) -> None:
        drv = self.driver
        assert drv is not None
        engine = self.engine
        ctx = engine.ctx
        ctrl = engine.controller
        server = self.server
        board = self.board
        port_rx = _PortRx(self)
        turns = self.turn_stats
        next_ctrl = 0
        if ready is not None:
            ready()
        while not self.stop:
            to = drv.timeout()
            if to is None or to > IDLE_TURN_S:
                to = IDLE_TURN_S
            if drv.want_write:
                to = min(to, 0.0005)
            events = wait(to, self.sel.select)
            began = time.monotonic_ns()
            notes_io: list[PeerNote] = []
            udp = False
            for key, mask in events:  # type: ignore[attr-defined]
                tag = key.data
                if tag == "udp":
                    udp = True
                elif isinstance(tag, Client):
                    server.on_io(tag, mask)
                elif isinstance(tag, PeerNote):
                    notes_io.append(tag)
                elif tag is server:
                    server.accept()
                elif tag == "wake":
                    with contextlib.suppress(BlockingIOError):
                        os.eventfd_read(self._wake_fd)
            drv.turn(udp)
            self.ops.deliver_wcs()
            now = time.monotonic_ns()
            evs = ctx.poll_ev_events()
            if evs:
                engine.carry_out(ctrl.on_ev_events(evs))
            probes = ctx.poll_probe_results()
            if probes:
                ctrl.on_probe_results(probes)
            if now >= next_ctrl:
                next_ctrl = now + CTRL_PERIOD_NS
                engine.carry_out(ctrl.tick(now, port_rx, engine.qp_samples()))
                drv.flush(now)
            server.flush()
            if board.wanted:
                board.publish(snapshot(engine, server.rejected))
            self.turned = time.monotonic()
            if notes_io or self.notifier.pending:  # peer notes: after the engine's work, never blocking
                now = time.monotonic_ns()
                for n in notes_io:
                    self.notifier.on_writable(n, now)
                self.notifier.pump(now)
            turns.add(time.monotonic_ns() - began)


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
