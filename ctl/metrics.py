"""Prometheus metrics of one mrcd (DESIGN.md §7): a custom collector that reads the host's BPF counter maps
and the engine's state at scrape time (nothing is copied into Counter objects on the data path).

Names: ``mrc_`` prefix, base units, ``_total`` on counters; labels only from small closed sets (``host``,
``plane``, ``port``, ``direction``, ``reason``, ``state``). Per-QP detail is in ``mrcctl qp show``.
"""

from __future__ import annotations

import platform
import socket
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import TYPE_CHECKING, Any, Final

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from mrc import __version__ as mrc_version
from mrc.transport import EvState

if TYPE_CHECKING:
    from .daemon import Daemon

RETX_CAUSES: Final = ("sack", "trim", "timeout", "nack", "rnr", "spurious")

#: Every metric the exporter emits (tests check the dashboard and alert rules against this list).
METRICS: Final = (
    "mrc_build_info", "mrc_up", "mrc_plane_up", "mrc_plane_tx_packets_total", "mrc_plane_tx_bytes_total",
    "mrc_plane_rx_packets_total", "mrc_plane_rx_bytes_total", "mrc_plane_rx_ecn_ce_total",
    "mrc_plane_rx_trimmed_total", "mrc_plane_engine_tx_bytes_total", "mrc_drops_total",
    "mrc_engine_drops_total", "mrc_retransmits_total", "mrc_trim_nacks_total", "mrc_ecn_echoes_total",
    "mrc_rto_total", "mrc_evs", "mrc_ev_events_total", "mrc_probes_total", "mrc_probe_replies_total",
    "mrc_controller_actions_total", "mrc_denied_links", "mrc_qps", "mrc_qp_cwnd_bytes", "mrc_qp_srtt_seconds",
    "mrc_data_tx_packets_total", "mrc_data_rx_packets_total", "mrc_data_tx_bytes_total",
    "mrc_data_rx_bytes_total", "mrc_start_time_seconds", "mrc_control_rejected_total",
)


class MrcCollector(Collector):
    def __init__(self, d: Daemon | None = None) -> None:
        self.d = d

    def describe(self) -> list[Any]:  # no collect() at registration
        return []

    def collect(self) -> Iterator[Any]:
        d = self.d
        if d is None:
            return
        h = d.host
        info = InfoMetricFamily("mrc_build", "mrc version and platform")
        info.add_metric([], {"version": mrc_version, "kernel": platform.release(),
                             "python": platform.python_version()})
        yield info
        up = GaugeMetricFamily("mrc_up", "1 while mrcd serves this host", labels=["host"])
        up.add_metric([h], 1.0)
        yield up
        start = GaugeMetricFamily("mrc_start_time_seconds", "mrcd start time (Unix seconds)", labels=["host"])
        start.add_metric([h], d.started)
        yield start
        # -- BPF maps (read outside the engine lock: separate syscalls, the loop keeps running)
        hs = d.fd._host_stats(h, False)
        lp = ["host", "plane", "port"]
        fams = {k: CounterMetricFamily(f"mrc_plane_{k}", doc, labels=lp) for k, doc in (
            ("tx_packets", "MRC packets the host egress program sent on the plane port"),
            ("tx_bytes", "bytes (with outer header) the host egress program sent on the plane port"),
            ("rx_packets", "well-formed MRC packets that arrived on the plane port (XDP)"),
            ("rx_bytes", "bytes of well-formed MRC packets that arrived on the plane port (XDP)"),
            ("rx_ecn_ce", "MRC packets that arrived with ECN-CE"),
            ("rx_trimmed", "trimmed MRC packets that arrived"))}
        drops = CounterMetricFamily("mrc_drops_total", "packets the eBPF programs dropped, by reason",
                                    labels=["host", "plane", "direction", "reason"])
        for plane, row in hs["planes"].items():
            lab = [h, str(plane), row["port"]]
            fams["tx_packets"].add_metric(lab, row.get("tx_packets", 0))
            fams["tx_bytes"].add_metric(lab, row.get("tx_bytes", 0))
            fams["rx_packets"].add_metric(lab, row.get("rx_packets", 0))
            fams["rx_bytes"].add_metric(lab, row.get("rx_bytes", 0))
            fams["rx_ecn_ce"].add_metric(lab, row.get("rx_ce", 0))
            fams["rx_trimmed"].add_metric(lab, row.get("rx_trimmed", 0))
            for reason, n in row.get("rx_drops", {}).items():
                drops.add_metric([h, str(plane), "rx", reason], n)
        for reason, n in hs.get("tx_drops", {}).items():
            drops.add_metric([h, "", "tx", reason], n)
        yield from fams.values()
        yield drops
        # -- engine and controller (under the loop's lock: a consistent snapshot)
        with d.lock:
            yield from self._engine()

    def _engine(self) -> Iterator[Any]:
        d = self.d
        assert d is not None
        h = d.host
        ctx = d.ctx
        planes = d.topo.planes
        qps = list(ctx.qps.values())
        edrops = CounterMetricFamily("mrc_engine_drops_total", "datagrams the engine rejected, by reason",
                                     labels=["host", "reason"])
        for reason, n in sorted(ctx.drops.items()):
            edrops.add_metric([h, reason], n)
        yield edrops
        rej = CounterMetricFamily("mrc_control_rejected_total",
                                  "control-socket requests answered with an error, by reason",
                                  labels=["host", "reason"])
        for reason, n in sorted(d.rejected.items()):
            rej.add_metric([h, reason], n)
        yield rej
        c: dict[str, int] = dict(d.gone_c)
        for qp in qps:
            for k, v in qp.c.items():
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
            f.add_metric([h], sum(int(getattr(q, attr)) for q in qps) + d.gone.get(attr, 0))
            yield f
        ptx = CounterMetricFamily("mrc_plane_engine_tx_bytes_total", "payload bytes the engine sprayed",
                                  labels=["host", "plane"])
        for p in range(planes):
            ptx.add_metric([h, str(p)], sum(int(q.paths.port_bytes[p]) for q in qps) + d.gone_port[p])
        yield ptx
        evs = GaugeMetricFamily("mrc_evs", "EVs of this host's QPs by state",
                                labels=["host", "plane", "state"])
        counts = {(p, s): 0 for p in range(planes) for s in EvState}
        for qp in qps:
            ps = qp.paths
            for i, evst in enumerate(ps.state):
                counts[(ps.ev_port[i], EvState(evst))] += 1
        for (p, s), n in counts.items():
            evs.add_metric([h, str(p), s.name.lower()], n)
        yield evs
        pup = GaugeMetricFamily("mrc_plane_up", "1 when the port is enabled and not failed",
                                labels=["host", "plane"])
        for p in range(planes):
            pup.add_metric([h, str(p)], float(ctx.port_enabled[p] and p not in d.controller.ports_down))
        yield pup
        eve = CounterMetricFamily("mrc_ev_events_total", "EV events consumed by the controller",
                                  labels=["host", "state"])
        for name in ("GOOD", "ASSUMED_BAD"):
            eve.add_metric([h, name.lower()], d.controller.event_counts.get(name, 0))
        yield eve
        act = CounterMetricFamily("mrc_controller_actions_total", "controller actions",
                                  labels=["host", "reason"])
        for k in ("deny", "restore", "port_down", "port_up", "probe"):
            act.add_metric([h, k], d.controller.counts.get(k, 0))
        yield act
        dl = GaugeMetricFamily("mrc_denied_links", "links the controller holds failed", labels=["host"])
        dl.add_metric([h], len(d.controller.denied))
        yield dl
        nq = GaugeMetricFamily("mrc_qps", "queue pairs on this host", labels=["host", "state"])
        nstate: dict[str, int] = {}
        for qp in qps:
            nstate[qp.state.name.lower()] = nstate.get(qp.state.name.lower(), 0) + 1
        for name in ("rts", "error"):
            nq.add_metric([h, name], nstate.get(name, 0))
        yield nq
        cw = SummaryMetricFamily("mrc_qp_cwnd_bytes", "congestion windows of the QPs (sum and count)",
                                 labels=["host"])
        cw.add_metric([h], len(qps), float(sum(q.cc.cwnd for q in qps)))
        yield cw
        rtts = [q.srtt for q in qps if q.srtt > 0]
        rt = SummaryMetricFamily("mrc_qp_srtt_seconds", "smoothed RTTs of the QPs (sum and count)",
                                 labels=["host"])
        rt.add_metric([h], len(rtts), sum(rtts) / 1e9)
        yield rt


def registry(collector: MrcCollector) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector)
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

    def start(self, d: Daemon) -> None:
        self.collector.d = d
        threading.Thread(target=self.srv.serve_forever, name="mrcd-metrics", daemon=True).start()

    def shutdown(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()
