"""mrcd's Prometheus exporter on a real engine and controller without a kernel (the daemon is built as in
test_controller.py, its BPF side replaced by fixed counters and program records in a temporary folder):
names, types and label sets; every controller action exported under `action`; per-QP gauges that go away
with their QP; drops with the plane they happened on (or none); `mrc_up` meaning what it says; the engine
snapshot published by the loop; process metrics; `promtool check metrics` clean; and the exported BPF drop
reasons being exactly those the host programs emit."""

from __future__ import annotations

import ast
import json
import math
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mrc import topology
from mrc.ctl import metrics
from mrc.ctl.controller import ACCESS_QUIET_NS, RESTORE_PROBE_NS, Action, ActionKind, Controller, link_name
from mrc.ctl.host_engine import HostEngine
from mrc.ctl.metrics import (
    EGRESS_DROP_REASONS,
    INGRESS_DROP_REASONS,
    METRICS,
    UP_STALE_S,
    MrcCollector,
    StatsBoard,
    dataplane_attached,
    registry,
    snapshot,
)
from mrc.dataplane.abi import DropReason
from mrc.transport import EvEvent, EvState, ProbeResult, QpState, QueuePair, WcStatus

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _mrcd_parts import PathRecorder  # noqa: E402

ALLOWED_LABELS = {"host", "plane", "port", "reason", "state", "action", "program", "result", "qpn", "peer",
                  "version", "kernel", "python", "le"}  # le: a histogram's bucket bound
PER_QP = {"mrc_qp_cwnd_bytes", "mrc_qp_srtt_seconds"}


class FakeFabric:
    """The daemon's BPF side: fixed counters and program records on disk (the path-map and allowed-QP
    writes go to a `PathRecorder`)."""

    def __init__(self, tmp: Path, planes: int) -> None:
        self.planes = {p: {"port": f"p{p}l0", "tx_packets": 10 + p, "tx_bytes": 1000, "rx_packets": 5,
                           "rx_bytes": 500, "rx_ce": 1, "rx_trimmed": 2, "rx_drops": {"foreign_qpn": 4 + p}}
                       for p in range(planes)}
        self.tx_drops = {"no_path": 7}
        self.unknown_port: dict[str, int] | None = None  # a testbed's shared program: not the host's
        self.egress = SimpleNamespace(record_path=tmp / "host_egress.json", maps={})
        self.ingress = SimpleNamespace(record_path=tmp / "host_ingress.json", maps={})
        for prog in (self.egress, self.ingress):
            prog.record_path.write_text(json.dumps({"attachments": [
                {"testbed": "tb", "node": h, "ifname": "x"} for h in ("h0", "h1", "h2", "h3")]}))


class Source:
    """What the exporter reads (`MetricsSource`), around a real `HostEngine` on the default topology. The
    loop is this test: a scrape's request is answered at once (`wake` publishes), unless `stuck`."""

    def __init__(self, tmp: Path) -> None:
        topo = topology.load(ROOT / "deploy" / "topologies" / "default.toml")
        self.host, self.planes = "h0", topo.planes
        self.fd = FakeFabric(tmp, topo.planes)
        self.told: list[tuple[str, str]] = []
        self.paths = PathRecorder()
        self.engine = HostEngine(topo, "h0", self.paths, lambda lk, st: self.told.append((link_name(lk), st)))
        self.rejected = {"bad_json": 2}
        self.notes = {"sent": 3, "dropped": 1}
        self.started = 1.0
        self.turned = time.monotonic()
        self.stuck = False
        self.board = StatsBoard(self._turn)
        self.rx = [0] * topo.planes
        for h in ("h1", "h2", "h3"):
            self.engine.peer_table(h)

    def _turn(self) -> None:
        if not self.stuck:
            self.board.publish(snapshot(self.engine, self.rejected, self.notes,
                                        ((1_000_000, 10_000_000), (5, 2, 1), 40_000_000), (2, 5)))

    def host_stats(self) -> dict[str, Any]:
        out = {"planes": self.fd.planes, "tx_drops": self.fd.tx_drops}
        if self.fd.unknown_port is not None:
            out["rx_drops_unknown_port"] = self.fd.unknown_port
        return out

    def attached(self) -> dict[str, bool]:
        return dataplane_attached(self.fd.egress, self.fd.ingress, "tb", self.host)


def _daemon(tmp: Path) -> Source:
    return Source(tmp)


def _qp(d: Source, peer: str) -> QueuePair:
    qp = d.engine.create_qp(peer)
    qp.connect(d.engine.peers[peer].gid, 0x100)
    return qp


def _events(d: Source, evs: list[EvEvent]) -> None:
    d.engine.carry_out(d.engine.controller.on_ev_events(evs))


def _tick(d: Source, now: int) -> None:
    d.engine.carry_out(d.engine.controller.tick(now, d.rx, d.engine.qp_samples()))


def _scrape(d: Source, **kw: Any) -> tuple[dict[str, Any], str]:
    text = generate_latest(registry(MrcCollector(d, **kw))).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}, text


def _value(fams: dict[str, Any], family: str, sample: str | None = None, **labels: str) -> float:
    got = [s.value for s in fams[family].samples
           if s.name == (sample or family) and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(got) == 1, (family, labels, got)
    return float(got[0])


def test_names_types_and_labels(tmp_path: Path) -> None:
    d = _daemon(tmp_path)
    _qp(d, "h2")
    d.engine.ctx.drops["unknown_qpn"] = 3
    fams, text = _scrape(d)
    for name in METRICS:
        fam = name.removesuffix("_total")
        assert fam in fams, f"{name} not exported"
    for f in fams.values():
        if not f.name.startswith("mrc_"):
            assert f.name.startswith(("process_", "python_")), f.name
            continue
        for s in f.samples:
            assert set(s.labels) <= ALLOWED_LABELS, (s.name, s.labels)
            assert not {"qpn", "peer"} & set(s.labels) or f.name in PER_QP, (s.name, s.labels)
        if f.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in f.samples), f.name
    assert fams["mrc_qp_cwnd_bytes"].type == "gauge" and fams["mrc_qp_srtt_seconds"].type == "gauge"
    assert 'mrc_plane_tx_packets_total{host="h0",plane="3",port="p3l0"} 13.0' in text
    assert 'mrc_ingress_drops_total{host="h0",plane="2",reason="foreign_qpn"} 6.0' in text
    assert 'mrc_egress_drops_total{host="h0",reason="no_path"} 7.0' in text
    assert 'mrc_engine_drops_total{host="h0",reason="unknown_qpn"} 3.0' in text
    assert 'mrc_control_rejected_total{host="h0",reason="bad_json"} 2.0' in text
    from mrc.dataplane.protocol import RejectReason

    for reason in RejectReason:  # the closed set at 0 from the first scrape: rate() sees the first one
        if reason != RejectReason.BAD_JSON:
            assert f'mrc_control_rejected_total{{host="h0",reason="{reason.value}"}} 0.0' in text, reason
    assert 'mrc_peer_notes_total{host="h0",result="dropped"} 1.0' in text
    assert 'mrc_control_clients{host="h0"} 2.0' in text and 'mrc_control_paused_total{host="h0"} 5.0' in text
    assert 'mrc_engine_turn_seconds_bucket{host="h0",le="0.01"} 7.0' in text  # cumulative: 5 + 2
    assert 'mrc_engine_turn_seconds_count{host="h0"} 8.0' in text
    assert 'mrc_evs{host="h0",plane="1",state="good"} 16.0' in text
    assert 'mrc_qps{host="h0",state="rts"} 1.0' in text
    assert 'mrc_qps{host="h0",state="error"} 0.0' in text
    assert "mrc_drops_total" not in text  # replaced by the ingress / egress families


def test_drops_carry_their_plane_or_none_and_every_reason_starts_at_zero(tmp_path: Path) -> None:
    d = _daemon(tmp_path)
    fams, _ = _scrape(d)
    ing = [s for s in fams["mrc_ingress_drops"].samples if s.name.endswith("_total")]
    eg = [s for s in fams["mrc_egress_drops"].samples if s.name.endswith("_total")]
    assert all(s.labels["plane"] in {"0", "1", "2", "3"} for s in ing)
    assert all("plane" not in s.labels for s in eg)
    assert {(s.labels["plane"], s.labels["reason"]) for s in ing} == {
        (str(p), r.label) for p in range(4) for r in INGRESS_DROP_REASONS}
    assert {s.labels["reason"] for s in eg} == {r.label for r in EGRESS_DROP_REASONS}
    assert _value(fams, "mrc_ingress_drops", "mrc_ingress_drops_total", plane="1", reason="bad_ip") == 0
    assert _value(fams, "mrc_egress_drops", "mrc_egress_drops_total", reason="encap_failed") == 0
    dead = {"buffer", "fault", "blackhole"}
    assert not dead & {s.labels["reason"] for s in ing + eg}
    # the engine's closed set too, before and after a drop is counted
    from mrc.transport.drops import EngineDrop

    eng = [s for s in fams["mrc_engine_drops"].samples if s.name.endswith("_total")]
    assert {s.labels["reason"] for s in eng} == {r.value for r in EngineDrop}
    assert all(s.value == 0 for s in eng)
    d.engine.ctx.receive(b"\x00" * 4, 0)
    fams, _ = _scrape(d)
    assert _value(fams, "mrc_engine_drops", "mrc_engine_drops_total", reason="truncated") == 1


def test_drops_of_frames_for_no_port_are_exported_under_plane_unknown(tmp_path: Path) -> None:
    """host_ingress drops an MRC frame sent to a MAC that is no port's (it used to pass it, past the
    port's QP filter) in row 0, which no port's row reads: a host's mrcd exports them as plane
    "unknown", every reason from zero; a testbed's mrcd, whose program serves every host, does not."""
    d = _daemon(tmp_path)
    fams, _ = _scrape(d)
    ing = [s for s in fams["mrc_ingress_drops"].samples if s.name.endswith("_total")]
    assert "unknown" not in {s.labels["plane"] for s in ing}
    d.fd.unknown_port = {"bad_ip": 3}
    fams, _ = _scrape(d)
    ing = [s for s in fams["mrc_ingress_drops"].samples if s.name.endswith("_total")]
    assert {s.labels["reason"] for s in ing if s.labels["plane"] == "unknown"} == {
        r.label for r in INGRESS_DROP_REASONS}
    assert _value(fams, "mrc_ingress_drops", "mrc_ingress_drops_total", plane="unknown", reason="bad_ip") == 3


def _actions(fams: dict[str, Any]) -> dict[str, float]:
    return {s.labels["action"]: s.value for s in fams["mrc_controller_actions"].samples
            if s.name == "mrc_controller_actions_total"}


def test_every_controller_action_is_exported_under_action(tmp_path: Path) -> None:
    d = _daemon(tmp_path)
    ctl: Controller = d.engine.controller
    fams, _ = _scrape(d)
    assert _actions(fams) == dict.fromkeys((k.value for k in ActionKind), 0.0)  # all there from the start
    assert all("reason" not in s.labels for s in fams["mrc_controller_actions"].samples)
    # a spine link fails: deny, replace, probe, restore (test_controller.py's scenario)
    qp = _qp(d, "h2")
    through = [i for i in range(64) if i % 4 == 0 and (i // 4) % 2 == 0]
    prof = qp.paths.profile
    _events(d, [EvEvent(1000, prof.profile_id, qp.qpn, i, i, 0, EvState.ASSUMED_BAD, 1) for i in through])
    _tick(d, 2000)
    _tick(d, 2000 + RESTORE_PROBE_NS)
    (probe,) = {i for per in ctl.denied.values() for i in per.get("h2", [])}
    _events(d, [EvEvent(3000 + RESTORE_PROBE_NS, 1, qp.qpn, probe, probe, 0, EvState.GOOD, 0)])
    assert not ctl.denied
    # our own plane-1 access link looks failed while its port still receives: suspect, then cleared
    qps = [_qp(d, p) for p in ("h1", "h2", "h3")]
    t = 10 * RESTORE_PROBE_NS
    for q in qps:
        _events(d, [EvEvent(t, 1, q.qpn, i, i, 1, EvState.ASSUMED_BAD, 1) for i in range(1, 64, 4)])
    _tick(d, t)
    d.rx[1] += 3
    _tick(d, t + ACCESS_QUIET_NS)
    for q in qps:
        _events(d, [EvEvent(t, 1, q.qpn, i, i, 1, EvState.GOOD, 0) for i in range(1, 64, 4)])
    _tick(d, t + ACCESS_QUIET_NS + 1)
    # the plane-0 access link really dies: suspect, deny, port_down
    t += 10 * ACCESS_QUIET_NS
    for q in qps:
        _events(d, [EvEvent(t, 1, q.qpn, i, i, 0, EvState.ASSUMED_BAD, 1) for i in range(0, 64, 4)])
    _tick(d, t)
    ctl.on_probe_results([ProbeResult(x, 0, 0, 0, False, -1) for x in range(t, t + ACCESS_QUIET_NS + 1,
                                                                              2_000_000)])
    _tick(d, t + ACCESS_QUIET_NS)
    assert ctl.ports_down == {0}
    fams, _ = _scrape(d)
    got = _actions(fams)
    logged = {k.value: sum(1 for a in ctl.log if a.kind == k) for k in ActionKind}
    logged["probe"] = ctl.counts["probe"]
    assert got == {k: float(v) for k, v in logged.items()}
    for k in ("deny", "replace", "restore", "probe", "suspect", "cleared", "port_down"):
        assert got[k] > 0, (k, got)


def test_action_kinds_are_a_closed_set() -> None:
    """Every kind the controller acts with is an ActionKind (so it is exported), and every ActionKind is
    used; an unknown kind is refused at `act`."""
    trees = [ast.parse((ROOT / "ctl" / f).read_text()) for f in ("controller.py", "daemon.py")]
    used: set[str] = set()
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Action":
            kind = node.args[1]
            if isinstance(kind, ast.Constant):
                used.add(str(kind.value))
            else:  # "port_up" if enabled else "port_down"
                assert isinstance(kind, ast.IfExp)
                used.update(str(x.value) for x in (kind.body, kind.orelse) if isinstance(x, ast.Constant))
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
              and node.value.attr == "counts" and isinstance(node.slice, ast.Constant)):
            used.add(str(node.slice.value))
    assert used == {k.value for k in ActionKind}
    ctl = Controller(topology.load(ROOT / "deploy" / "topologies" / "default.toml"), "h0", 64)
    with pytest.raises(ValueError):
        ctl.act(Action(0, "reboot", "h0-p0l0", 0))
    assert not ctl.log and not ctl.counts


def test_per_qp_gauges_follow_the_qps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _daemon(tmp_path)
    a, b = _qp(d, "h2"), _qp(d, "h3")
    a.srtt = 250_000  # ns
    a.serial, a.tx_bytes = 10, 40960
    fams, _ = _scrape(d)
    assert _value(fams, "mrc_qp_cwnd_bytes", qpn=str(a.qpn), peer="h2") == a.cc.cwnd
    assert _value(fams, "mrc_qp_cwnd_bytes", qpn=str(b.qpn), peer="h3") == b.cc.cwnd
    assert _value(fams, "mrc_qp_srtt_seconds", qpn=str(a.qpn), peer="h2") == pytest.approx(250e-6)
    assert not [s for s in fams["mrc_qp_srtt_seconds"].samples if s.labels["qpn"] == str(b.qpn)]  # no sample
    # a destroyed QP's series go; the totals keep what it did
    d.engine.destroy_qp(a.qpn)
    fams, _ = _scrape(d)
    assert {s.labels["qpn"] for s in fams["mrc_qp_cwnd_bytes"].samples} == {str(b.qpn)}
    assert not fams["mrc_qp_srtt_seconds"].samples
    assert _value(fams, "mrc_data_tx_bytes", "mrc_data_tx_bytes_total") == 40960
    assert _value(fams, "mrc_data_tx_packets", "mrc_data_tx_packets_total") == 10
    # a QP in ERROR is counted as such
    b.set_error(WcStatus.RETRY_EXC_ERR, 0)
    fams, _ = _scrape(d)
    assert b.state == QpState.ERROR
    assert _value(fams, "mrc_qps", state="error") == 1 and _value(fams, "mrc_qps", state="rts") == 0
    # bounded: at most QP_SERIES_MAX QPs (the lowest QPNs) get series, mrc_qps counts them all
    monkeypatch.setattr(metrics, "QP_SERIES_MAX", 2)
    more = [_qp(d, "h1") for _ in range(3)]
    fams, _ = _scrape(d)
    assert {s.labels["qpn"] for s in fams["mrc_qp_cwnd_bytes"].samples} == {str(b.qpn), str(more[0].qpn)}
    assert _value(fams, "mrc_qps", state="rts") == 3


def test_mrc_up_means_the_loop_runs_and_the_dataplane_is_attached(tmp_path: Path) -> None:
    d = _daemon(tmp_path)
    fams, _ = _scrape(d)
    assert _value(fams, "mrc_up", host="h0") == 1
    assert _value(fams, "mrc_engine_loop_age_seconds") < UP_STALE_S
    assert _value(fams, "mrc_dataplane_attached", program="host_ingress") == 1
    d.turned = time.monotonic() - 2 * UP_STALE_S  # the loop has not turned for 10 s
    fams, _ = _scrape(d)
    assert _value(fams, "mrc_up", host="h0") == 0
    assert _value(fams, "mrc_engine_loop_age_seconds") >= 2 * UP_STALE_S
    d.turned = 0.0  # never turned
    fams, _ = _scrape(d)
    assert _value(fams, "mrc_up") == 0 and math.isinf(_value(fams, "mrc_engine_loop_age_seconds"))
    d.turned = time.monotonic()
    # `mrcctl prog detach` rewrote host_ingress's record without this host, then removed it
    d.fd.ingress.record_path.write_text(json.dumps({"attachments": [{"testbed": "tb", "node": "h1"}]}))
    fams, _ = _scrape(d)
    assert _value(fams, "mrc_up") == 0
    assert _value(fams, "mrc_dataplane_attached", program="host_ingress") == 0
    assert _value(fams, "mrc_dataplane_attached", program="host_egress") == 1
    d.fd.ingress.record_path.unlink()
    fams, _ = _scrape(d)
    assert _value(fams, "mrc_up") == 0 and _value(fams, "mrc_dataplane_attached", program="host_ingress") == 0


def test_the_engine_families_come_from_the_snapshot_the_loop_published(tmp_path: Path) -> None:
    d = _daemon(tmp_path)
    qp = _qp(d, "h2")
    before = d.board.published
    fams, _ = _scrape(d)
    assert d.board.published == before + 1  # one scrape, one snapshot, published by the "loop"
    assert _value(fams, "mrc_qp_cwnd_bytes", qpn=str(qp.qpn), peer="h2") == qp.cc.cwnd
    # the loop moves on after publishing: a copy, not a view, was formatted
    snap = d.board.request(1.0)
    assert snap is not None
    qp.cc.cwnd += 4096
    assert snap.qps[0].cwnd_bytes == qp.cc.cwnd - 4096


def test_a_stuck_loop_still_gets_an_answer_without_the_engine(tmp_path: Path) -> None:
    """A loop stuck inside a turn publishes nothing: the scrape answers after its wait, mrc_up 0, the
    BPF families there, the engine's absent."""
    d = _daemon(tmp_path)
    _qp(d, "h2")
    d.stuck = True
    fams, _ = _scrape(d, wait_s=0.01)
    assert _value(fams, "mrc_up") == 0
    assert "mrc_plane_tx_packets" in fams and "mrc_controller_actions" not in fams
    d.stuck = False
    fams, _ = _scrape(d)
    assert _value(fams, "mrc_up") == 1 and "mrc_controller_actions" in fams


def test_the_board_serves_a_scrape_from_another_thread(tmp_path: Path) -> None:
    """As in mrcd: the scrape waits in its thread while the loop (here the main thread) publishes after a
    turn in which it saw `wanted`; nothing is shared but the board."""
    d = _daemon(tmp_path)
    board = StatsBoard()  # no wake: the loop polls `wanted`, as mrcd's does once per turn
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(board.request(10.0)))
    t.start()
    deadline = time.monotonic() + 10
    while not board.wanted and time.monotonic() < deadline:
        time.sleep(0.001)
    assert board.wanted
    board.publish(snapshot(d.engine, d.rejected))
    t.join(10)
    assert got and got[0] is not None and got[0].rejected == {"bad_json": 2} and not board.wanted


def test_process_and_platform_metrics(tmp_path: Path) -> None:
    fams, _ = _scrape(_daemon(tmp_path))
    for name in ("process_cpu_seconds", "process_resident_memory_bytes", "process_open_fds",
                 "process_start_time_seconds", "python_info"):
        assert name in fams, name


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus) not installed")
def test_promtool_check_metrics_is_clean(tmp_path: Path) -> None:
    d = _daemon(tmp_path)
    for peer in ("h1", "h2"):
        _qp(d, peer).srtt = 100_000
    d.engine.ctx.drops["unknown_qpn"] = 1
    _, text = _scrape(d)
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr


def _emitted(program: str) -> set[DropReason]:
    src = (ROOT / "bpf" / f"{program}.c").read_text()
    return {DropReason[m] for m in re.findall(r"\bdrop\([^,;()]+,\s*MRC_DROP_([A-Z_]+)", src)}


def test_exported_drop_reasons_are_those_the_host_programs_emit() -> None:
    assert set(INGRESS_DROP_REASONS) == _emitted("host_ingress")
    assert set(EGRESS_DROP_REASONS) == _emitted("host_egress")
    dead = set(DropReason) - set(INGRESS_DROP_REASONS) - set(EGRESS_DROP_REASONS)
    assert dead == {DropReason.BUFFER, DropReason.FAULT, DropReason.BLACKHOLE}
    switch = (ROOT / "bpf" / "switch_port.c").read_text()
    assert "MRC_DROP_" not in switch  # the switch counts its drops as actions, not drop reasons


def test_collector_is_empty_until_mrcd_hands_it_the_daemon() -> None:
    assert list(MrcCollector().collect()) == []


def test_every_reason_the_control_server_rejects_with_is_in_the_closed_set() -> None:
    """mrc_control_rejected_total{reason} is published for RejectReason's members from the start; a
    reason the server or the protocol's validation raises must be one of them (no free-form string)."""
    import re
    from pathlib import Path

    from mrc.dataplane.protocol import RejectReason

    root = Path(__file__).resolve().parents[2]
    for f in ("ctl/control_server.py", "dataplane/protocol.py", "ctl/operations.py"):
        text = (root / f).read_text()
        literal = re.findall(
            r'(?:RequestRejected|_bad|ProtocolError)\(\s*(?:ErrorKind\.\w+,\s*)?"([a-z_]+)"', text)
        assert not literal, f"{f}: free-form reasons {literal}"
        for name in re.findall(r"RejectReason\.([A-Z_]+)", text):
            assert name in RejectReason.__members__, (f, name)


def test_a_metrics_address_in_use_names_where_it_came_from() -> None:
    """mrcd said only "[Errno 98] Address already in use": which option or key, which address?"""
    import socket

    import pytest

    from mrc.ctl.daemon import _metrics_server
    from mrc.errors import MrcError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(MrcError) as e:
            _metrics_server(("127.0.0.1", port), "/etc/mrc/mrcd.toml: metrics.address")
    assert str(e.value) == (f"/etc/mrc/mrcd.toml: metrics.address: cannot serve /metrics on "
                            f"127.0.0.1:{port}: Address already in use")
    from mrc.hostconfig import host_port

    assert host_port("::1", 9471) == "[::1]:9471" and host_port("127.0.0.1", 1) == "127.0.0.1:1"
