"""Prometheus metrics of one mrcd (docs/design.md §7, docs/daemon.md "Metrics"): a custom collector that reads
the host's BPF counter maps and a snapshot of the engine's state at scrape time (nothing is copied into
Counter objects on the data path).

Why a published snapshot: the engine's state belongs to the loop thread alone (no lock). A scrape asks the
loop for a snapshot (`StatsBoard.request`: a flag and a wake-up of the loop's selector); the loop copies
the numbers out at the end of its turn (`snapshot`: plain lists and dicts, C-speed copies, no counting) and
publishes it; the scrape thread counts and formats outside the loop. Copying at every turn instead would
cost each of thousands of turns a second the copy of every QP, for a scrape a few times a minute. When the
loop does not publish within `SNAPSHOT_WAIT_S` (it is stuck in a turn), the scrape still answers, with
`mrc_up` 0 and without the engine's families, instead of hanging.

Names: ``mrc_`` prefix, base units, ``_total`` on counters; labels only from small closed sets (``host``,
``plane``, ``port``, ``reason``, ``state``, ``action``, ``program``, ``result``), except the per-QP gauges
(``qpn``, ``peer``), whose series are bounded by `QP_SERIES_MAX` and go away with their QP. The process and
platform collectors of prometheus_client add ``process_*`` and ``python_*``.
"""

from __future__ import annotations

import math
import platform
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final, Protocol

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from mrc import __version__ as mrc_version
from mrc.dataplane.abi import DropReason
from mrc.dataplane.bpf import attached_here
from mrc.dataplane.protocol import RejectReason
from mrc.transport import EvState, QpState
from mrc.transport.drops import EngineDrop

from .control_server import MAX_QUEUED_REPLY_BYTES, MAX_TOTAL_QUEUED_REPLY_BYTES, REPLY_FLOOR_BYTES

if TYPE_CHECKING:
    from .host_engine import HostEngine

RETX_CAUSES: Final = ("sack", "trim", "timeout", "nack", "rnr", "spurious")

#: The drop reasons each host program really emits (the `drop(..., MRC_DROP_*)` calls of bpf/host_ingress.c
#: and bpf/host_egress.c; tests/unit/test_metrics_exporter.py checks these tuples against the sources).
#: Every one is exported from the first scrape, at 0 until it happens. `DropReason` also holds BUFFER,
#: FAULT and BLACKHOLE, which no host program emits: those are switch-port actions (bpf/switch_port.c,
#: `SwitchAction.DROP_*`, read by `mrcctl fault`/`mrcctl stats`, not by a host's mrcd), so they are not
#: exported here.
INGRESS_DROP_REASONS: Final = (DropReason.TRUNCATED, DropReason.BAD_IP, DropReason.BAD_LENGTH,
                               DropReason.BAD_VERSION, DropReason.BAD_OPCODE, DropReason.FOREIGN_QPN)
EGRESS_DROP_REASONS: Final = (DropReason.TRUNCATED, DropReason.BAD_VERSION, DropReason.BAD_OPCODE,
                              DropReason.NO_PATH, DropReason.ENCAP_FAILED)

#: mrc_up is 1 only if the engine loop finished a turn within this many seconds (a healthy loop turns at
#: least every 50 ms: its select times out at 0.05 s).
UP_STALE_S: Final = 5.0
#: How long a scrape waits for the loop's snapshot before it answers without the engine's families.
SNAPSHOT_WAIT_S: Final = 1.0
#: At most this many QPs (the lowest QPNs) get per-QP series; `mrc_qps` counts them all. A host's QPs are
#: bounded by the ingress allowed-QP map (`abi.QPS_MAX`, 65,536 for a whole fabric), far too many series:
#: this cap is what bounds the scrape.
QP_SERIES_MAX: Final = 1024

#: Every metric the exporter emits (tests check the dashboard and alert rules against this list).
METRICS: Final = (
    "mrc_build_info", "mrc_up", "mrc_engine_loop_age_seconds", "mrc_dataplane_attached", "mrc_plane_up",
    "mrc_plane_tx_packets_total", "mrc_plane_tx_bytes_total",
    "mrc_plane_rx_packets_total", "mrc_plane_rx_bytes_total", "mrc_plane_rx_ecn_ce_total",
    "mrc_plane_rx_trimmed_total", "mrc_plane_engine_tx_bytes_total", "mrc_ingress_drops_total",
    "mrc_egress_drops_total", "mrc_engine_drops_total", "mrc_retransmits_total", "mrc_trim_nacks_total",
    "mrc_ecn_echoes_total", "mrc_rto_total", "mrc_evs", "mrc_ev_events_total", "mrc_probes_total",
    "mrc_probe_replies_total", "mrc_controller_actions_total", "mrc_denied_links", "mrc_qps",
    "mrc_qp_cwnd_bytes", "mrc_qp_srtt_seconds", "mrc_data_tx_packets_total", "mrc_data_rx_packets_total",
    "mrc_data_tx_bytes_total", "mrc_data_rx_bytes_total", "mrc_start_time_seconds",
    "mrc_control_rejected_total", "mrc_control_clients", "mrc_control_paused_total", "mrc_peer_notes_total",
    "mrc_engine_turn_seconds",
)

@dataclass(frozen=True)
class QpSnapshot:
    """One QP's numbers, copied out by the loop."""

    qpn: int
    peer: str
    state: str  # QpState name, lower case
    cwnd_bytes: int
    srtt_ns: int  # 0: no RTT sample yet
    counters: dict[str, int]  # QueuePair.c
    data: dict[str, int]  # _DATA_ATTRS
    port_bytes: list[int]
    ev_state: list[int]
    ev_port: list[int]


@dataclass(frozen=True)
class EngineSnapshot:
    """What the engine-side families are formatted from (plain copies: the loop may run on meanwhile)."""

    engine_drops: dict[str, int]
    rejected: dict[str, int]
    gone_counters: dict[str, int]  # counters of destroyed QPs (the totals never go down)
    gone_data: dict[str, int]
    gone_port_bytes: list[int]
    port_enabled: list[bool]
    ports_down: frozenset[int]
    ev_events: dict[str, int]
    actions: dict[str, int]
    denied_links: int
    qps: list[QpSnapshot]
    peer_notes: dict[str, int] = field(default_factory=dict)  # PeerNotifier.tally: sent, dropped
    # the loop's turn durations: (upper bounds in ns, cumulative-free counts per bucket + overflow, sum ns)
    turns: tuple[tuple[int, ...], tuple[int, ...], int] | None = None
    control: tuple[int, int] = (0, 0)  # the control socket's clients now, and its flow-control pauses


def snapshot(e: HostEngine, rejected: dict[str, int], peer_notes: dict[str, int] | None = None,
             turns: tuple[tuple[int, ...], tuple[int, ...], int] | None = None,
             control: tuple[int, int] = (0, 0)) -> EngineSnapshot:
    """Copy the engine's and the controller's numbers out of `e` (on the loop thread, between turns):
    nothing here counts or formats (the scrape thread does that), it only copies lists and dicts."""
    from .host_engine import DATA_ATTRS

    qp_peer = e.qp_peer
    qps = [QpSnapshot(qpn, qp_peer.get(qpn) or "none", qp.state.name.lower(), int(qp.cc.cwnd), int(qp.srtt),
                      dict(qp.c), {a: int(getattr(qp, a)) for a in DATA_ATTRS}, list(qp.paths.port_bytes),
                      list(qp.paths.state), list(qp.paths.ev_port))
           for qpn, qp in e.ctx.qps.items()]
    ctl = e.controller
    return EngineSnapshot(dict(e.ctx.drops), dict(rejected), dict(e.gone_c), dict(e.gone),
                          list(e.gone_port), list(e.ctx.port_enabled), frozenset(ctl.ports_down),
                          dict(ctl.event_counts), dict(ctl.counts), len(ctl.denied), qps,
                          dict(peer_notes or {}), turns, control)


class StatsBoard:
    """Where the loop hands an `EngineSnapshot` to scrape threads. `request` (any thread) raises the
    `wanted` flag, calls `wake` (mrcd: a write to an eventfd in the loop's selector) and waits for the next
    `publish`; the loop checks `wanted` once per turn (one attribute read) and publishes when it is up.
    Several scrapes waiting at once are served by the same snapshot."""

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        self.wake = wake
        self.wanted = False
        self._cond = threading.Condition()
        self._seq = 0
        self._snap: EngineSnapshot | None = None
        self.published = 0

    def publish(self, snap: EngineSnapshot) -> None:
        with self._cond:
            self._snap = snap
            self._seq += 1
            self.published += 1
            self.wanted = False
            self._cond.notify_all()

    def request(self, timeout_s: float) -> EngineSnapshot | None:
        """A snapshot published after this call, or None when none comes within `timeout_s`."""
        with self._cond:
            seq = self._seq
            self.wanted = True
        if self.wake is not None:
            self.wake()
        with self._cond:
            if not self._cond.wait_for(lambda: self._seq > seq, timeout_s):
                return None
            return self._snap


def dataplane_attached(egress: Any, ingress: Any, site: str, host: str) -> dict[str, bool]:
    """host_egress / host_ingress -> whether its record still lists an attachment on `host` of `site`
    (`mrc.dataplane.bpf.attached_here`)."""
    return {kind: prog is not None and attached_here(prog, site, host)
            for kind, prog in (("host_egress", egress), ("host_ingress", ingress))}


class MetricsSource(Protocol):
    """What the collector reads: mrcd (ctl/daemon.py) in service, a small object in tests."""

    host: str
    planes: int
    started: float  # Unix time of the start
    turned: float  # time.monotonic() at the end of the loop's last turn (0.0 before the first)
    board: StatsBoard

    def host_stats(self) -> dict[str, Any]:
        """The host programs' per-plane counters (`FabricDataplane.host_stats`)."""

    def attached(self) -> dict[str, bool]:
        """host_egress / host_ingress -> still attached on this host."""


class MrcCollector(Collector):
    def __init__(self, d: MetricsSource | None = None, *, wait_s: float = SNAPSHOT_WAIT_S) -> None:
        self.d = d
        self.wait_s = wait_s

    def describe(self) -> list[Metric]:  # no collect() at registration
        return []

    def collect(self) -> Iterator[Metric]:
        d = self.d
        if d is None:
            return
        h = d.host
        # -- the engine: a snapshot published by the loop
        snap = d.board.request(self.wait_s)
        # -- BPF maps and program records (separate syscalls from this thread; the loop keeps running)
        hs = d.host_stats()
        attached = d.attached()
        age = time.monotonic() - d.turned if d.turned else math.inf
        info = InfoMetricFamily("mrc_build", "mrc version and platform")
        info.add_metric([], {"version": mrc_version, "kernel": platform.release(),
                             "python": platform.python_version()})
        yield info
        up = GaugeMetricFamily("mrc_up", f"1 when the engine loop turned within {UP_STALE_S:g} s, its state "
                               "could be read, and host_egress and host_ingress are attached; else 0",
                               labels=["host"])
        up.add_metric([h], float(snap is not None and age <= UP_STALE_S and all(attached.values())))
        yield up
        la = GaugeMetricFamily("mrc_engine_loop_age_seconds",
                               "seconds since the engine loop last finished a turn (+Inf before the first)",
                               labels=["host"])
        la.add_metric([h], age)
        yield la
        att = GaugeMetricFamily("mrc_dataplane_attached", "1 while the host program is attached on this host",
                                labels=["host", "program"])
        for kind, ok in attached.items():
            att.add_metric([h, kind], float(ok))
        yield att
        start = GaugeMetricFamily("mrc_start_time_seconds", "mrcd start time (Unix seconds)", labels=["host"])
        start.add_metric([h], d.started)
        yield start
        yield from _dataplane(h, hs)
        if snap is not None:
            yield from _engine(h, d.planes, snap)


def _dataplane(h: str, hs: dict[str, Any]) -> Iterator[Metric]:
    lp = ["host", "plane", "port"]
    fams = {k: CounterMetricFamily(f"mrc_plane_{k}", doc, labels=lp) for k, doc in (
        ("tx_packets", "MRC packets the host egress program sent on the plane port"),
        ("tx_bytes", "bytes (with outer header) the host egress program sent on the plane port"),
        ("rx_packets", "well-formed MRC packets that arrived on the plane port (XDP)"),
        ("rx_bytes", "bytes of well-formed MRC packets that arrived on the plane port (XDP)"),
        ("rx_ecn_ce", "MRC packets that arrived with ECN-CE"),
        ("rx_trimmed", "trimmed MRC packets that arrived"))}
    idrops = CounterMetricFamily("mrc_ingress_drops_total",
                                 "packets host_ingress (XDP) dropped on the plane port, by reason",
                                 labels=["host", "plane", "reason"])
    for plane, row in hs["planes"].items():
        lab = [h, str(plane), row["port"]]
        fams["tx_packets"].add_metric(lab, row.get("tx_packets", 0))
        fams["tx_bytes"].add_metric(lab, row.get("tx_bytes", 0))
        fams["rx_packets"].add_metric(lab, row.get("rx_packets", 0))
        fams["rx_bytes"].add_metric(lab, row.get("rx_bytes", 0))
        fams["rx_ecn_ce"].add_metric(lab, row.get("rx_ce", 0))
        fams["rx_trimmed"].add_metric(lab, row.get("rx_trimmed", 0))
        got = row.get("rx_drops", {})
        for r in INGRESS_DROP_REASONS:
            idrops.add_metric([h, str(plane), r.label], got.get(r.label, 0))
    if "rx_drops_unknown_port" in hs:
        # frames host_ingress could name no port for (a MAC that is no port's: broadcast, multicast, a
        # stale or foreign unicast; frames too short for Ethernet): plane "unknown". Only where the
        # program is this mrcd's own (a host configuration); a testbed's serves every host
        got = hs["rx_drops_unknown_port"]
        for r in INGRESS_DROP_REASONS:
            idrops.add_metric([h, "unknown", r.label], got.get(r.label, 0))
    yield from fams.values()
    yield idrops
    # host_egress counts per host: it drops before it has a path (no_path, malformed) or without telling
    # which plane (encap_failed): no plane label
    edrops = CounterMetricFamily("mrc_egress_drops_total", "packets host_egress (tc) dropped, by reason",
                                 labels=["host", "reason"])
    got = hs.get("tx_drops", {})
    for r in EGRESS_DROP_REASONS:
        edrops.add_metric([h, r.label], got.get(r.label, 0))
    yield edrops


def _engine(h: str, planes: int, s: EngineSnapshot) -> Iterator[Metric]:
    # imported here: daemon.py imports this module at its top (MetricsServer)
    from .controller import ActionKind

    qps = s.qps
    edrops = CounterMetricFamily("mrc_engine_drops_total", "datagrams the engine rejected, by reason",
                                 labels=["host", "reason"])
    # every reason of the closed set (Context.drop takes only these), at 0 from the first scrape
    for drop in EngineDrop:
        edrops.add_metric([h, drop.value], s.engine_drops.get(drop, 0))
    yield edrops
    rej = CounterMetricFamily("mrc_control_rejected_total",
                              "control-socket requests answered with an error (and descriptors closed "
                              "unused: too_many_fds), by reason",
                              labels=["host", "reason"])
    # every reason of the closed set at 0 from the first scrape (and any other the server counted)
    for reason in sorted({r.value for r in RejectReason} | set(s.rejected)):
        rej.add_metric([h, reason], s.rejected.get(reason, 0))
    yield rej
    c: dict[str, int] = dict(s.gone_counters)
    for q in qps:
        for k, v in q.counters.items():
            c[k] = c.get(k, 0) + int(v)
    retx = CounterMetricFamily("mrc_retransmits_total", "data retransmissions, by cause",
                               labels=["host", "reason"])
    for cause in RETX_CAUSES:
        retx.add_metric([h, cause], c.get(f"retx_{cause}", 0))
    yield retx
    for name, key, doc in (("mrc_trim_nacks_total", "nack_trim_rx", "TRIMMED NACKs received"),
                           ("mrc_ecn_echoes_total", "ecn_echo_rx", "SACKs echoing ECN-CE"),
                           ("mrc_rto_total", "rto", "ACK timeouts (retransmission timer expiries)"),
                           ("mrc_probes_total", "probe_tx", "EV probes sent"),
                           ("mrc_probe_replies_total", "probe_reply_rx", "EV probe replies received")):
        f = CounterMetricFamily(name, doc, labels=["host"])
        f.add_metric([h], c.get(key, 0))
        yield f
    for name, attr, doc in (("mrc_data_tx_packets_total", "serial", "data packets sent (and resent)"),
                            ("mrc_data_rx_packets_total", "rx_packets", "data packets received"),
                            ("mrc_data_tx_bytes_total", "tx_bytes", "payload bytes sent"),
                            ("mrc_data_rx_bytes_total", "rx_bytes", "payload bytes received")):
        f = CounterMetricFamily(name, doc, labels=["host"])
        f.add_metric([h], sum(q.data[attr] for q in qps) + s.gone_data.get(attr, 0))
        yield f
    ptx = CounterMetricFamily("mrc_plane_engine_tx_bytes_total", "payload bytes the engine sprayed",
                              labels=["host", "plane"])
    for p in range(planes):
        ptx.add_metric([h, str(p)], sum(q.port_bytes[p] for q in qps) + s.gone_port_bytes[p])
    yield ptx
    evs = GaugeMetricFamily("mrc_evs", "EVs of this host's QPs by state", labels=["host", "plane", "state"])
    counts = {(p, st): 0 for p in range(planes) for st in EvState}
    for q in qps:
        for port, st in zip(q.ev_port, q.ev_state, strict=False):
            counts[(port, EvState(st))] += 1
    for (p, st), n in counts.items():
        evs.add_metric([h, str(p), st.name.lower()], n)
    yield evs
    pup = GaugeMetricFamily("mrc_plane_up", "1 when the port is enabled and not failed",
                            labels=["host", "plane"])
    for p in range(planes):
        pup.add_metric([h, str(p)], float(s.port_enabled[p] and p not in s.ports_down))
    yield pup
    eve = CounterMetricFamily("mrc_ev_events_total", "EV events consumed by the controller",
                              labels=["host", "state"])
    for name in ("GOOD", "ASSUMED_BAD"):
        eve.add_metric([h, name.lower()], s.ev_events.get(name, 0))
    yield eve
    act = CounterMetricFamily("mrc_controller_actions_total", "controller actions, by action",
                              labels=["host", "action"])
    for k in ActionKind:
        act.add_metric([h, k.value], s.actions.get(k.value, 0))
    yield act
    dl = GaugeMetricFamily("mrc_denied_links", "links the controller holds failed", labels=["host"])
    dl.add_metric([h], s.denied_links)
    yield dl
    nq = GaugeMetricFamily("mrc_qps", "queue pairs on this host, by state", labels=["host", "state"])
    nstate = dict.fromkeys((st.name.lower() for st in QpState), 0)
    for q in qps:
        nstate[q.state] = nstate.get(q.state, 0) + 1
    for name, n in nstate.items():
        nq.add_metric([h, name], n)
    yield nq
    notes = CounterMetricFamily("mrc_peer_notes", "link_status notes to peer mrcds, by result (sent; "
                                "dropped: the peer's socket missing, refusing or unreachable for 1 s)",
                                labels=["host", "result"])
    for result in ("sent", "dropped"):
        notes.add_metric([h, result], s.peer_notes.get(result, 0))
    yield notes
    clients = GaugeMetricFamily("mrc_control_clients", "connections to the control socket now",
                                labels=["host"])
    clients.add_metric([h], s.control[0])
    yield clients
    paused = CounterMetricFamily("mrc_control_paused", "times a client's requests went unread because "
                                 f"{MAX_QUEUED_REPLY_BYTES >> 20} MiB of its replies waited for it, or "
                                 f"{REPLY_FLOOR_BYTES >> 10} KiB while all clients' passed "
                                 f"{MAX_TOTAL_QUEUED_REPLY_BYTES >> 20} MiB (flow control)", labels=["host"])
    paused.add_metric([h], s.control[1])
    yield paused
    if s.turns is not None:
        bounds, per_bucket, sum_ns = s.turns
        cum, buckets = 0, []
        for b, n in zip((*[f"{x / 1e9:g}" for x in bounds], "+Inf"), per_bucket, strict=True):
            cum += n
            buckets.append((b, cum))
        hist = HistogramMetricFamily("mrc_engine_turn_seconds", "how long the engine loop's turns took "
                                     "(select's return to the turn's end): a turn that blocks shows here",
                                     labels=["host"])
        hist.add_metric([h], buckets, sum_ns / 1e9)
        yield hist
    shown = sorted(qps, key=lambda q: q.qpn)[:QP_SERIES_MAX]
    cw = GaugeMetricFamily("mrc_qp_cwnd_bytes", "congestion window of the QP (current value)",
                           labels=["host", "qpn", "peer"])
    rt = GaugeMetricFamily("mrc_qp_srtt_seconds", "smoothed RTT of the QP (current value; QPs with an RTT "
                           "sample only)", labels=["host", "qpn", "peer"])
    for q in shown:
        cw.add_metric([h, str(q.qpn), q.peer], q.cwnd_bytes)
        if q.srtt_ns > 0:
            rt.add_metric([h, str(q.qpn), q.peer], q.srtt_ns / 1e9)
    yield cw
    yield rt


def registry(collector: MrcCollector) -> CollectorRegistry:
    """mrcd's registry: its own collector plus the process (``process_*``: CPU, memory, fds, start time),
    platform (``python_info``) and GC collectors that the default registry would have had."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
    ProcessCollector(registry=reg)
    PlatformCollector(registry=reg)
    GCCollector(registry=reg)
    return reg


class MetricsServer:
    """/metrics on addr:port. Bound at construction (mrcd binds it in the root namespace, before it moves
    into its host's namespace), served from a thread by `start(daemon)`."""

    def __init__(self, addr: str, port: int) -> None:
        from prometheus_client.exposition import MetricsHandler

        self.collector = MrcCollector()
        handler = MetricsHandler.factory(registry(self.collector))
        cls = ThreadingHTTPServer
        if ":" in addr:
            class _V6(ThreadingHTTPServer):
                address_family = socket.AF_INET6
            cls = _V6
        self.srv = cls((addr, port), handler)
        self.srv.daemon_threads = True
        self.addr = (addr, port)
        self.serving = False

    def start(self, d: MetricsSource) -> None:
        self.collector.d = d
        self.serving = True
        threading.Thread(target=self.srv.serve_forever, name="mrcd-metrics", daemon=True).start()

    def shutdown(self) -> None:
        # socketserver's shutdown() waits for serve_forever to stop: never started (mrcd failed before
        # `start`, e.g. at its control socket), it waited for ever, the dataplane still installed
        if self.serving:
            self.srv.shutdown()
        self.srv.server_close()
