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
import dataclasses
import os
import resource
import selectors
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Final, NoReturn

from mrc import __version__ as mrc_version
from mrc import hostconfig
from mrc.dataplane import netns, sdnotify
from mrc.dataplane import testbed as tbmod
from mrc.dataplane.client import check_socket_path
from mrc.dataplane.driver import SocketDriver, wait
from mrc.dataplane.host import serving_pid
from mrc.dataplane.udp import mrc_socket
from mrc.errors import MrcError
from mrc.hostconfig import HostConfigError
from mrc.transport import QpAttr

from .control_server import MAX_CLIENTS, Client, ControlServer
from .controller import Link
from .host_engine import DEFAULT_EVS, HostEngine
from .metrics import MetricsServer, StatsBoard, snapshot
from .operations import MAX_MRS, Operations
from .peer_notes import PeerNote, PeerNotifier, link_status_line
from .site import ConfigSite, Site, TestbedSite

CTRL_PERIOD_NS: Final = 2_000_000  # controller pass at most every 2 ms
SITE_POLL_NS: Final = 1_000_000_000  # the site's housekeeping (`Site.poll`) about once a second
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
        self.sum_ns = 0
        self.buckets = [0] * (len(TURN_BUCKETS_NS) + 1)

    def add(self, ns: int) -> None:
        self.turns += 1
        self.sum_ns += ns
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


class _PortRx:
    """The ports' receive counters as the controller's lazy `port_rx[plane]`: each index is a read of
    host_ingress's per-CPU counters, done only when the controller asks (while it suspects a port)."""

    def __init__(self, site: Site) -> None:
        self.site = site

    def __getitem__(self, plane: int) -> int | None:
        return self.site.port_rx_packets(plane)


def qp_attr_overrides(attr: QpAttr) -> QpAttr:
    """`attr` with the environment's switches to an older behaviour, so both run on one testbed or host
    side by side: ``MRC_SAME_PORT_RACK=0`` (the cross-port loss rule alone, docs/transport.md),
    ``MRC_EV_REFUTE=0`` (EVs retired by a wrong loss call come back by probes only),
    ``MRC_ACK_REQ_FLOOR=BYTES`` (AckReq on every packet below that many bytes in flight; ``-1``:
    ack_coalesce x mtu, the engine's default, where mrcd's own is 0; docs/daemon.md, "Gigabit speeds")
    and ``MRC_ACK_DELAY_NS=NS`` (the delayed ACK; ``4000``: the engine's, where mrcd's own is longer on
    fast ports, hostconfig.mrcd_ack_delay_ns; docs/daemon.md, "Fewer SACKs on fast links").
    A value that is not an integer in QpAttr's range stops mrcd with the variable's name."""
    if os.environ.get("MRC_SAME_PORT_RACK", "1").strip() == "0":
        attr = dataclasses.replace(attr, same_port_rack=False)
    if os.environ.get("MRC_EV_REFUTE", "1").strip() == "0":
        attr = dataclasses.replace(attr, ev_refute=False)
    for var, field in (("MRC_ACK_REQ_FLOOR", "ack_req_floor"), ("MRC_ACK_DELAY_NS", "ack_delay_ns")):
        value = os.environ.get(var, "").strip()
        if value:
            try:
                changed: dict[str, Any] = {field: int(value)}
                attr = dataclasses.replace(attr, **changed)
                attr.check()
            except ValueError as err:
                raise MrcError(f"{var}={value!r}: {err}") from None
    return attr


class Daemon:
    """mrcd: the `HostEngine` on the host's MRC socket (`SocketDriver`), the control socket
    (`ControlServer` + `Operations`), peer notes (`PeerNotifier`), the metrics' snapshot (`StatsBoard`),
    all in one selector loop on one thread (the metrics server's thread only waits for the published
    snapshot and reads BPF counters). Where it runs (a testbed host, or a real host from its configuration
    file) is its `Site` (ctl/site.py)."""

    def __init__(self, site: Site, *, metrics: MetricsServer | None = None, seed: int = 0) -> None:
        self.site = site
        self.host = site.host
        self.planes = site.fabric.planes
        self.ns = site.ns
        self.socket_file = site.socket_file
        self.metrics = metrics
        self.started = time.time()
        #: time.monotonic() at the end of the loop's last turn (0.0 before the first): mrc_up and
        #: mrc_engine_loop_age_seconds say how long ago the engine last ran (ctl/metrics.py)
        self.turned = 0.0
        self.stop = False
        self.sel = selectors.DefaultSelector()
        self.notifier = PeerNotifier(self.sel)
        self.engine = HostEngine(site.fabric, site.host, site.paths, self.tell_peers, evs=site.evs,
                                 seed=seed or os.getpid(), nscc=site.nscc, null_cc_default=site.nscc is None,
                                 qp_attr=qp_attr_overrides(site.qp_attr))
        self.ops = Operations(self.engine, site=site.name, port_ifname=site.port_ifname,
                              link_rate_bps=max(site.port_rate_bps), io_stats=self._io_stats)
        self.server = ControlServer(self.sel, self.ops)
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.sel.register(self._wake_fd, selectors.EVENT_READ, "wake")
        self.board = StatsBoard(self._wake)
        self.turn_stats = TurnStats()
        self.sock: socket.socket | None = None
        self.driver: SocketDriver | None = None

    # -- what the metrics read (ctl/metrics.py MetricsSource)
    def host_stats(self) -> dict[str, Any]:
        return self.site.host_stats()

    def attached(self) -> dict[str, bool]:
        return self.site.attached()

    def _wake(self) -> None:
        """Called from a scrape thread: make the loop's select return now."""
        with contextlib.suppress(OSError):
            os.eventfd_write(self._wake_fd, 1)

    def _io_stats(self) -> dict[str, Any]:
        assert self.driver is not None
        return {"driver": self.driver.stats(), "peer_notes": dict(self.notifier.tally),
                "loop": self.turn_stats.to_dict(), "dataplane": self.site.host_stats(),
                "control": {"clients": len(self.server.clients), "rejected": dict(self.server.rejected),
                            "paused": self.server.paused_total}}

    # -- lifecycle
    def start(self) -> None:
        for h in self.engine.peer_names():
            self.engine.peer_table(h)
        self.sock = mrc_socket(self.ns, str(self.site.fabric.address(self.host)), rcvbuf=32 << 20)
        self.driver = SocketDriver(self.engine.ctx, self.sock, self.site.ifindex_plane(),
                                   port_rate_bps=list(self.site.port_rate_bps))
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
        self.site.close()

    def tell_peers(self, lk: Link, state: str) -> None:
        """Queue, for every other host's mrcd, the line saying that fabric link `lk` failed / returned (a
        `link_status` request on its control socket; on a real fabric this is the controllers' own
        channel). Nothing is sent here: the loop does it (`PeerNotifier.pump`) after the engine's turn."""
        msg = link_status_line(lk, state, self.host)
        now = time.monotonic_ns()
        for peer in self.engine.peer_names():
            path = self.site.peer_socket(peer)
            if path is not None:
                self.notifier.send(path, msg, now)

    # -- main loop
    def run(self, ready: Any = None) -> None:
        drv = self.driver
        assert drv is not None
        engine = self.engine
        ctx = engine.ctx
        ctrl = engine.controller
        server = self.server
        board = self.board
        port_rx = _PortRx(self.site)
        turns = self.turn_stats
        next_ctrl = next_poll = 0
        if ready is not None:
            ready()
        while not self.stop:
            to = drv.timeout()
            if to is None or to > IDLE_TURN_S:
                to = IDLE_TURN_S
            if drv.want_write:
                to = min(to, 0.0005)
            if server.busy:  # requests left by the last turn's budget
                to = 0.0
            events = wait(to, self.sel.select)
            began = time.monotonic_ns()
            server.begin_turn()
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
                if now >= next_poll:
                    next_poll = now + SITE_POLL_NS
                    try:
                        self.site.poll()
                    except (MrcError, OSError) as e:  # housekeeping never ends the loop
                        _log(f"site housekeeping: {e}")
            server.flush()
            if board.wanted:
                board.publish(snapshot(engine, server.rejected, self.notifier.tally,
                                       (TURN_BUCKETS_NS, tuple(turns.buckets), turns.sum_ns),
                                       (len(server.clients), server.paused_total)))
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


def _metrics_server(addr: tuple[str, int], where: str) -> MetricsServer:
    """/metrics bound at `addr`; a bind that fails (the address in use, not local) is an MrcError naming
    where the address came from and the address (it was a bare "[Errno 98] Address already in use")."""
    try:
        return MetricsServer(*addr)
    except OSError as e:
        raise MrcError(f"{where}: cannot serve /metrics on {hostconfig.host_port(*addr)}: "
                       f"{e.strerror or e}") from None


def _positive_us(value: str) -> int:
    """A duration in microseconds, 1 .. 10 s."""
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a whole number of microseconds") from None
    if not 1 <= n <= 10_000_000:
        raise argparse.ArgumentTypeError(f"{value}: expected 1 .. 10000000 microseconds")
    return n


def _socket_file(value: str) -> Path:
    """--socket: a path a unix socket can have, refused as a usage error before anything is set up (bind
    would fail at start-up with "AF_UNIX path too long")."""
    try:
        return check_socket_path(value)
    except MrcError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class _Parser(argparse.ArgumentParser):
    """argparse with the project's error style: a usage error is one line `mrcd: error: ...` on stderr
    (as mrcctl's), not argparse's usage block before it, which hides the error in five lines; exit
    status 2 as argparse's. `mrcd --help` is untouched."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")


def _log(msg: str) -> None:
    print(f"mrcd: {msg}", file=sys.stderr, flush=True)


#: Descriptors mrcd may need: one per memory region (Python's mmap keeps a duplicate of the memfd for
#: as long as the mapping lives), one per control connection, plus its sockets, maps and peer notes.
NOFILE_WANTED: Final = MAX_MRS + MAX_CLIENTS + 1024


def _raise_nofile() -> None:
    """Raise the soft descriptor limit toward NOFILE_WANTED (a soft limit of 1024, the usual default,
    would stop reg_mr near its 1000th region with EMFILE); where the hard limit is lower, say what that
    allows and how to raise it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = NOFILE_WANTED if hard == resource.RLIM_INFINITY else min(NOFILE_WANTED, hard)
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
    if soft != resource.RLIM_INFINITY and soft < NOFILE_WANTED:
        _log(f"the descriptor limit is {soft} (hard limit {hard}): about {max(0, soft - 1024)} memory "
             f"regions can be registered; raise it (systemd: LimitNOFILE={NOFILE_WANTED}) for {MAX_MRS}")


def _check_config(path: str) -> int:
    """`mrcd --check-config FILE`: validate and print what would be installed; changes nothing, needs no
    root."""
    try:
        cfg = hostconfig.load(path)
    except HostConfigError as e:
        print(f"mrcd: error: {e}", file=sys.stderr)
        return e.exit_code
    try:
        print("\n".join(hostconfig.describe(cfg)), flush=True)
    except BrokenPipeError:  # `mrcd --check-config F | head`: the reader left, which is not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(prog="mrcd",
                 description="MRC controller daemon for one host (docs/daemon.md; on a real "
                             "host from its configuration file: docs/deploy.md).")
    ap.add_argument("-V", "--version", action="version", version=f"mrcd {mrc_version}")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--config", metavar="FILE", help="start from this host configuration file")
    where.add_argument("--check-config", metavar="FILE",
                       help="validate FILE and print what mrcd would install; change nothing")
    where.add_argument("--host", help="the testbed host this mrcd serves (e.g. h0)")
    ap.add_argument("--testbed", default=None, help="testbed name (default: the only one up)")
    ap.add_argument("--evs", type=int, default=DEFAULT_EVS, help="EVs per peer (split over the planes; "
                    "testbed only, a configuration file has [engine] evs)")
    ap.add_argument("--reorder-us", type=_positive_us, default=2000,
                    help="QP reordering tolerance (microseconds; testbed only)")
    ap.add_argument("--probe-timeout-us", type=_positive_us, default=20000,
                    help="a path probe without reply after this long failed (microseconds; testbed only)")
    ap.add_argument("--metrics", type=_addr, default=None, metavar="ADDR:PORT",
                    help="serve /metrics here (default: the file's [metrics], else none)")
    ap.add_argument("--socket", type=_socket_file, default=None,
                    help="control socket (default: the file's [control] socket, or /run/mrc/<host>.sock)")
    ap.add_argument("--ready-fd", type=int, default=None, help="write 'ready\\n' to this fd when serving")
    ap.add_argument("--no-netns", action="store_true",
                    help="stay in the current network namespace (default: move into the host's after "
                         "binding the metrics address here, so 'testbed down' ends mrcd with its namespace)")
    args = ap.parse_args(argv)
    if args.check_config is not None:
        return _check_config(args.check_config)
    if os.geteuid() != 0:
        print("mrcd: error: needs root (CAP_NET_ADMIN, CAP_BPF)", file=sys.stderr)
        return 1
    _raise_nofile()
    d: Daemon | None = None
    site: Site | None = None
    stopping = False

    got_signal: list[int] = []  # printed after the loop: a print inside the handler may re-enter stderr

    def _stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        if not stopping:
            stopping = True
            sdnotify.stopping()
            got_signal.append(signum)
        if d is not None:
            d.stop = True
        else:  # still setting up: end the setup (its cleanup runs on the way out)
            raise SystemExit(1)

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    signal.signal(signal.SIGHUP, _stop)
    metrics: MetricsServer | None = None
    try:
        if args.config is not None:
            cfg = hostconfig.load(args.config)
            pid = serving_pid(cfg)  # before anything is bound: its metrics address would be in use
            if pid is not None:
                raise MrcError(f"another mrcd (pid {pid}) serves host {cfg.name}: stop it first")
            maddr = args.metrics or cfg.metrics
            if maddr is not None:
                source = "--metrics" if args.metrics else f"{args.config}: metrics.address"
                metrics = _metrics_server(maddr, source)
            site = ConfigSite(cfg, socket_file=args.socket, log=_log)
        else:
            name = tbmod.resolve_name(args.testbed)
            if args.metrics is not None:
                metrics = _metrics_server(args.metrics, "--metrics")
            if not args.no_netns:
                netns.enter_for_exec(tbmod.Testbed.load(name).ns(args.host))
            site = TestbedSite(name, args.host, evs=args.evs, socket_file=args.socket,
                               reorder_ns=args.reorder_us * 1000,
                               probe_timeout_ns=args.probe_timeout_us * 1000)
        d = Daemon(site, metrics=metrics)
        d.start()
        if stopping:
            # a signal during set-up whose SystemExit was swallowed (raised inside a finaliser or a
            # weakref callback, which Python only reports): the request stands, set-up is undone
            raise SystemExit(1)
    except BaseException as e:  # also SIGTERM during set-up (SystemExit): undo what was made, then say why
        if d is not None:
            d.close()
        else:
            if site is not None:
                site.close()
            if metrics is not None:
                metrics.srv.server_close()
        if not isinstance(e, (MrcError, OSError)):
            raise
        print(f"mrcd: error: {e}", file=sys.stderr)
        sdnotify.status(f"error: {e}")
        return e.exit_code if isinstance(e, HostConfigError) else 1
    daemon = d

    def ready() -> None:
        maddr = metrics.addr if metrics is not None else None
        _log(f"{daemon.host} serving {daemon.socket_file}"
             + (f", metrics on {hostconfig.host_port(*maddr)}" if maddr else ""))
        if args.ready_fd is not None:
            with contextlib.suppress(OSError):
                os.write(args.ready_fd, b"ready\n")
                os.close(args.ready_fd)
        sdnotify.ready(f"{daemon.host}: serving {daemon.socket_file}")
        sdnotify.start_watchdog(lambda: daemon.turned)

    try:
        daemon.run(ready)
    finally:
        daemon.close()
    # the log says why mrcd ended (the runbook reads it): a signal, not a crash
    _log(f"{daemon.host}: stopped" + (f" on {signal.Signals(got_signal[0]).name}" if got_signal else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
