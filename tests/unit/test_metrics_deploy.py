"""mrcd's Prometheus exporter and the deploy/ files that use it (no root, no kernel): names follow the
conventions (mrc_ prefix, base units, _total on counters, small label sets), every metric the Grafana
dashboard and the alert rules reference is exported, the dashboard has its stable uid and provisioning,
Prometheus' own checker accepts the scrape config and the rules, the systemd unit detaches on stop."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mrc import topology
from mrc.ctl.metrics import METRICS, MrcCollector, registry
from mrc.transport import Context, EvProfile

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ALLOWED_LABELS = {"host", "plane", "port", "direction", "reason", "state", "version", "kernel", "python"}


def _fake_daemon() -> Any:
    topo = topology.load(DEPLOY / "topologies" / "default.toml")
    ctx = Context(topo.mrc_address("h0").packed, ports=topo.planes)
    prof = ctx.create_ev_profile(EvProfile.even(1, 16, topo.planes))
    cq = ctx.create_cq()
    qp = ctx.create_qp(cq, ev_profile=prof)
    qp.connect(topo.mrc_address("h2").packed, 0x100)
    ctx.drops["unknown_qpn"] = 3
    planes = {p: {"port": f"p{p}l0", "tx_packets": 10 + p, "tx_bytes": 1000, "rx_packets": 5, "rx_bytes": 500,
                  "rx_ce": 1, "rx_trimmed": 2, "rx_drops": {"foreign_qpn": 4}} for p in range(topo.planes)}
    fd = SimpleNamespace(_host_stats=lambda h, b: {"planes": planes, "tx_drops": {"no_path": 1}})
    ctl = SimpleNamespace(counts={"deny": 1}, event_counts={"ASSUMED_BAD": 2}, ports_down=set(), denied={})
    return SimpleNamespace(host="h0", topo=topo, ctx=ctx, fd=fd, lock=threading.Lock(), controller=ctl,
                           gone={}, gone_c={}, gone_port=[0] * topo.planes, started=1.0,
                           rejected={"bad_json": 2})


def _families() -> tuple[dict[str, Any], str]:
    text = generate_latest(registry(MrcCollector(_fake_daemon()))).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}, text


def test_exporter_names_units_and_labels() -> None:
    fams, text = _families()
    exported = {s.name for f in fams.values() for s in f.samples}
    for name in METRICS:
        assert any(s == name or s.startswith(name + "_") or s == name.removesuffix("_total") + "_total"
                   for s in exported), f"{name} not exported"
    for f in fams.values():
        assert f.name.startswith("mrc_"), f.name
        for s in f.samples:
            assert set(s.labels) <= ALLOWED_LABELS, (s.name, s.labels)
        if f.type == "counter":
            assert all(s.name.endswith(("_total", "_created")) for s in f.samples), f.name
    assert 'mrc_plane_tx_packets_total{host="h0",plane="3",port="p3l0"} 13.0' in text
    assert 'mrc_drops_total{direction="rx",host="h0",plane="0",reason="foreign_qpn"} 4.0' in text
    assert 'mrc_engine_drops_total{host="h0",reason="unknown_qpn"} 3.0' in text
    assert 'mrc_control_rejected_total{host="h0",reason="bad_json"} 2.0' in text
    assert 'mrc_evs{host="h0",plane="1",state="good"} 4.0' in text
    assert 'mrc_qps{host="h0",state="rts"} 1.0' in text


def _referenced(text: str) -> set[str]:
    names = set(re.findall(r"\b(mrc_[a-z0-9_]+)", text))
    return {re.sub(r"_(sum|count|bucket)$", "", n) for n in names}


def test_dashboard_and_rules_reference_only_exported_metrics() -> None:
    dash = json.loads((DEPLOY / "grafana" / "dashboards" / "mrc-overview.json").read_text())
    assert dash["uid"] == "mrc-overview"
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    rules = (DEPLOY / "prometheus" / "mrc.rules.yml").read_text()
    refs = _referenced(exprs) | _referenced(rules)
    assert refs, "no metric referenced"
    missing = refs - set(METRICS)
    assert not missing, f"referenced but not exported: {sorted(missing)}"
    titles = " ".join(p["title"].lower() for p in dash["panels"])
    for what in ("plane", "trim", "ecn", "retransmit", "ev states"):
        assert what in titles
    prov = (DEPLOY / "grafana" / "provisioning" / "dashboards" / "mrc.yaml").read_text()
    assert "type: file" in prov and "apiVersion: 1" in prov


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian prometheus) not installed")
def test_promtool_accepts_config_and_rules() -> None:
    for args in (["check", "config", str(DEPLOY / "prometheus" / "prometheus.yml")],
                 ["check", "rules", str(DEPLOY / "prometheus" / "mrc.rules.yml")]):
        r = subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


def test_systemd_unit_detaches_on_stop() -> None:
    unit = (DEPLOY / "systemd" / "mrcd.service").read_text()
    assert "ExecStopPost=/usr/bin/mrcctl prog detach --all" in unit
    assert "After=network-online.target" in unit and "Wants=network-online.target" in unit
    assert "CAP_BPF" in unit and "CAP_NET_ADMIN" in unit and "Type=simple" in unit
